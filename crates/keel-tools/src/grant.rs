//! Patterns over tool names, and a run's grant (the tools it may call). A pattern is a
//! name (`echo`), a prefix ending in `*` (`fs.*`, `mcp:github/*`, `mcp:*`), or `*` for
//! every tool. The same patterns select tools for policy overrides and MCP approval.

use std::fmt;

/// One pattern over tool names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Every tool.
    All,
    /// Names that start with this prefix (the pattern without its trailing `*`).
    Prefix(String),
    Exact(String),
}

/// Characters a tool name or pattern may hold, besides ASCII letters and digits.
const PUNCTUATION: &[char] = &['_', '.', '-', ':', '/'];

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let hint =
            "write a tool name (`echo`), a prefix ending in `*` (`fs.*`, `mcp:github/*`) or `*` for all";
        if text.is_empty() {
            return Err(format!("a tool pattern is empty; {hint}"));
        }
        if text.chars().any(char::is_whitespace) {
            return Err(format!("tool pattern {text:?} contains whitespace; {hint}"));
        }
        if text == "*" {
            return Ok(Pattern::All);
        }
        let (body, glob) = match text.strip_suffix('*') {
            Some(prefix) => (prefix, true),
            None => (text, false),
        };
        if let Some(bad) = body.chars().find(|c| !(c.is_ascii_alphanumeric() || PUNCTUATION.contains(c))) {
            let what = if bad == '*' {
                "`*` is only allowed at the end".to_owned()
            } else {
                format!("{bad:?} is not allowed")
            };
            return Err(format!(
                "tool pattern {text:?}: {what} (names use letters, digits and `_ . - : /`); {hint}"
            ));
        }
        Ok(if glob { Pattern::Prefix(body.to_owned()) } else { Pattern::Exact(body.to_owned()) })
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Prefix(prefix) => name.starts_with(prefix.as_str()),
            Pattern::Exact(exact) => name == exact,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::All => f.write_str("*"),
            Pattern::Prefix(prefix) => write!(f, "{prefix}*"),
            Pattern::Exact(exact) => f.write_str(exact),
        }
    }
}

/// Whether `pattern` matches `name`. A pattern that does not parse matches nothing
/// (patterns from config were checked when it was loaded).
pub fn matches(pattern: &str, name: &str) -> bool {
    Pattern::parse(pattern).is_ok_and(|p| p.matches(name))
}

/// The tools a run may call: any name matched by one of its patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant(pub Vec<Pattern>);

impl Grant {
    /// Parses every pattern; the first bad one is the error.
    pub fn parse(patterns: &[String]) -> Result<Grant, String> {
        patterns.iter().map(|p| Pattern::parse(p)).collect::<Result<Vec<_>, _>>().map(Grant)
    }

    /// What a run gets when it asks for nothing: the built-ins.
    pub fn default_builtins() -> Grant {
        Grant(
            ["echo", "kv.*", "fs.*", "http.fetch"]
                .iter()
                .map(|p| Pattern::parse(p).unwrap_or(Pattern::Exact((*p).to_owned())))
                .collect(),
        )
    }

    pub fn allows(&self, name: &str) -> bool {
        self.0.iter().any(|p| p.matches(name))
    }

    /// The patterns as written.
    pub fn patterns(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(patterns: &[&str]) -> Grant {
        Grant::parse(&patterns.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn patterns_match_exactly_by_prefix_or_all() {
        let cases: &[(&str, &str, bool)] = &[
            ("echo", "echo", true),
            ("echo", "echo2", false),
            ("echo", "ech", false),
            ("fs.*", "fs.read", true),
            ("fs.*", "fs.write", true),
            ("fs.*", "fsx.read", false),
            ("fs.*", "fs", false),
            ("kv.*", "kv.get", true),
            ("mcp:fs/*", "mcp:fs/read_file", true),
            ("mcp:fs/*", "mcp:fsx/a", false),
            ("mcp:fs/*", "mcp:fs", false),
            ("mcp:*", "mcp:github/create_issue", true),
            ("mcp:*", "echo", false),
            ("mcp:github/*", "mcp:github/a", true),
            ("mcp:github/*", "mcp:gitlab/a", false),
            ("*", "anything.at/all", true),
            ("*", "", true),
            ("mcp:fs/write_*", "mcp:fs/write_file", true),
            ("mcp:fs/write_*", "mcp:fs/read_file", false),
            ("Word_Count", "word_count", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(matches(pattern, name), *expected, "{pattern} vs {name}");
        }
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        for (text, says) in [
            ("", "empty"),
            (" echo", "whitespace"),
            ("fs .read", "whitespace"),
            ("fs.\t*", "whitespace"),
            ("f*s", "only allowed at the end"),
            ("**", "only allowed at the end"),
            ("fs.rea?", "'?' is not allowed"),
            ("ech\u{e9}", "is not allowed"),
            ("a,b", "',' is not allowed"),
        ] {
            let err = Pattern::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
            assert!(err.contains("`fs.*`"), "{text:?}: {err}");
        }
        assert!(!matches("f*s", "fxs"), "a bad pattern matches nothing");
        let err = Grant::parse(&["echo".into(), "bad pattern".into()]).unwrap_err();
        assert!(err.contains("\"bad pattern\""), "{err}");
    }

    #[test]
    fn grants_allow_what_any_pattern_matches() {
        let g = grant(&["echo", "fs.*", "mcp:github/*"]);
        assert!(g.allows("echo"));
        assert!(g.allows("fs.list"));
        assert!(g.allows("mcp:github/x"));
        assert!(!g.allows("kv.get"));
        assert!(!g.allows("fsx.read"));
        assert!(!g.allows("mcp:fs/x"));
        assert!(!grant(&[]).allows("echo"), "an empty grant allows nothing");
        assert!(grant(&["*"]).allows("mcp:any/thing"));
        assert_eq!(g.patterns(), vec!["echo", "fs.*", "mcp:github/*"]);
    }

    #[test]
    fn the_default_grant_is_the_builtins() {
        let g = Grant::default_builtins();
        assert_eq!(g.patterns(), vec!["echo", "kv.*", "fs.*", "http.fetch"]);
        for name in crate::BUILTIN_NAMES {
            assert!(g.allows(name), "{name}");
        }
        assert!(!g.allows("word_count"));
        assert!(!g.allows("mcp:fs/read"));
        assert!(!g.allows("http.fetcher"));
    }
}
