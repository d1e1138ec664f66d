//! Agents declared in keel.toml (`[[agents]]`): a name, what the agent does, its skills,
//! and the run that serves it. Those with `a2a = true` are published over A2A (an agent
//! card, and a JSON-RPC endpoint that starts and continues their runs; `kernel/a2a.rs`).
//!
//! ```toml
//! [[agents]]
//! name = "echo"
//! description = "Repeats what it is told."
//! a2a = true
//! command = ["python3", "echo.py"]        # and any POST /v1/runs option: sandbox, budget, ...
//! [[agents.skills]]
//! id = "echo"
//! name = "Echo"
//! description = "Echoes the text back."
//! tags = ["demo"]
//! ```

use keel_protocol::api::CreateRunParams;
use serde::Deserialize;

use crate::CreateRun;

/// One skill of an agent, as its card lists it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
}

/// An agent of `[[agents]]`.
#[derive(Debug, Clone)]
pub struct AgentDecl {
    pub name: String,
    pub description: String,
    pub version: String,
    pub skills: Vec<Skill>,
    /// Published over A2A.
    pub a2a: bool,
    /// The run each task starts (its `input` is the task's message).
    pub run: CreateRunParams,
}

/// Every `[[agents]]` entry of keel.toml, in order.
#[derive(Debug, Clone, Default)]
pub struct AgentsConfig {
    pub agents: Vec<AgentDecl>,
}

/// The keys of an `[[agents]]` entry that are the agent's; the rest are its run's.
const AGENT_KEYS: [&str; 5] = ["name", "description", "version", "skills", "a2a"];

impl AgentsConfig {
    /// The `[[agents]]` entries of a keel.toml document (other tables are others').
    pub fn from_keel_toml(text: &str) -> Result<AgentsConfig, String> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            agents: Option<toml::Value>,
        }
        let doc: Doc = toml::from_str(text).map_err(|e| format!("keel.toml: {e}"))?;
        let entries = match doc.agents {
            None => return Ok(AgentsConfig::default()),
            Some(toml::Value::Array(entries)) => entries,
            Some(_) => return Err("keel.toml: `agents` must be an array of tables: write [[agents]]".into()),
        };
        let mut agents: Vec<AgentDecl> = Vec::new();
        for (index, entry) in entries.into_iter().enumerate() {
            let toml::Value::Table(mut table) = entry else {
                return Err(format!("keel.toml [[agents]] #{}: must be a table", index + 1));
            };
            let name = table.get("name").and_then(toml::Value::as_str).unwrap_or("").to_owned();
            let place = format!("keel.toml [[agents]] #{} ({name:?})", index + 1);
            let agent = parse_agent(&mut table, name, &place)?;
            if agents.iter().any(|other| other.name == agent.name) {
                return Err(format!("{place}: another agent has this name; names are unique"));
            }
            agents.push(agent);
        }
        Ok(AgentsConfig { agents })
    }

    /// The agents published over A2A.
    pub fn a2a(&self) -> impl Iterator<Item = &AgentDecl> {
        self.agents.iter().filter(|agent| agent.a2a)
    }

    pub fn a2a_agent(&self, name: &str) -> Option<&AgentDecl> {
        self.a2a().find(|agent| agent.name == name)
    }
}

fn parse_agent(table: &mut toml::Table, name: String, place: &str) -> Result<AgentDecl, String> {
    if name.is_empty()
        || name.len() > 64
        || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'))
    {
        return Err(format!(
            "{place}: `name` must be 1-64 of a-z, 0-9, '-' and '_' (it is a path segment of /a2a/NAME)"
        ));
    }
    let text = |table: &toml::Table, key: &str| -> Result<Option<String>, String> {
        match table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(format!("{place}: `{key}` must be a string")),
        }
    };
    let description = text(table, "description")?
        .filter(|text| !text.trim().is_empty())
        .ok_or_else(|| format!("{place}: `description` is required: say what the agent does"))?;
    let version = text(table, "version")?.unwrap_or_else(|| "1.0.0".to_owned());
    let a2a = match table.get("a2a") {
        None => false,
        Some(toml::Value::Boolean(flag)) => *flag,
        Some(_) => return Err(format!("{place}: `a2a` must be true or false")),
    };
    let skills: Vec<Skill> = match table.get("skills") {
        None => Vec::new(),
        Some(value) => value.clone().try_into().map_err(|e| format!("{place}: `skills`: {e}"))?,
    };
    for (index, skill) in skills.iter().enumerate() {
        if skill.id.is_empty() || skill.name.is_empty() || skill.description.is_empty() {
            return Err(format!(
                "{place}: skill #{} needs a non-empty `id`, `name` and `description`",
                index + 1
            ));
        }
        if skills[..index].iter().any(|other| other.id == skill.id) {
            return Err(format!("{place}: two skills have the id {:?}", skill.id));
        }
    }
    for key in AGENT_KEYS {
        table.remove(key);
    }
    if table.contains_key("input") {
        return Err(format!("{place}: `input` is not allowed: each task's message is the run's input"));
    }
    let run: CreateRunParams = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| format!("{place}: not a valid run (the keys of POST /v1/runs besides `input`): {e}"))?;
    // Checked now as a task would start it, so a bad option stops the kernel's start.
    CreateRun::validate(run.clone()).map_err(|e| format!("{place}: {e}"))?;
    Ok(AgentDecl { name, description, version, skills, a2a, run })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ECHO: &str = r#"
[[agents]]
name = "echo"
description = "Repeats what it is told."
a2a = true
command = ["python3", "echo.py"]
sandbox = { tier = "none" }
[[agents.skills]]
id = "echo"
name = "Echo"
description = "Echoes the text back."
tags = ["demo"]

[[agents]]
name = "private"
description = "Not published."
command = ["true"]
"#;

    #[test]
    fn agents_are_read_with_their_skills_and_run() {
        let config = AgentsConfig::from_keel_toml(ECHO).unwrap();
        assert_eq!(config.agents.len(), 2);
        let echo = config.a2a_agent("echo").unwrap();
        assert_eq!(echo.run.command, ["python3", "echo.py"]);
        assert_eq!(echo.skills[0].tags, ["demo"]);
        assert_eq!(echo.version, "1.0.0");
        assert!(config.a2a_agent("private").is_none(), "only a2a = true agents are published");
        assert!(AgentsConfig::from_keel_toml("[llm]\n").unwrap().agents.is_empty());
    }

    #[test]
    fn bad_entries_are_refused_naming_the_entry_and_the_field() {
        let base = "[[agents]]\nname = \"a\"\ndescription = \"d\"\ncommand = [\"true\"]\n";
        let cases: [(String, &str); 8] = [
            ("agents = 3\n".into(), "array of tables"),
            (base.replace("name = \"a\"", "name = \"A b\""), "`name` must be"),
            (base.replace("description = \"d\"\n", ""), "`description` is required"),
            (base.replace("command = [\"true\"]", "command = []"), "`command` is empty"),
            (format!("{base}a2a = \"yes\"\n"), "`a2a` must be true or false"),
            (format!("{base}input = 1\n"), "`input` is not allowed"),
            (format!("{base}colour = 1\n"), "unknown field `colour`"),
            (format!("{base}{base}"), "names are unique"),
        ];
        for (text, needle) in cases {
            let error = AgentsConfig::from_keel_toml(&text).unwrap_err();
            assert!(error.contains(needle), "{text}\n=> {error}");
        }
        let skill = format!("{base}[[agents.skills]]\nid = \"s\"\nname = \"\"\ndescription = \"d\"\n");
        assert!(AgentsConfig::from_keel_toml(&skill).unwrap_err().contains("skill #1"));
    }
}
