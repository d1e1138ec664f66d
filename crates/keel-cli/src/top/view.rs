//! `keel top` without IO: what it shows ([`App`], updated from `/v1/status` and `/v1/runs`
//! snapshots), what a key does to it ([`App::key`], answering the [`Action`] to perform),
//! and how it is drawn ([`draw`], a function of the app and a frame). Tested with
//! ratatui's `TestBackend`.

use std::collections::HashMap;

use keel_protocol::api::{EventView, RunView, StatusView};
use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, TableState};

use crate::render::age;

/// The most log lines kept for the logs pane (the oldest go first).
const MAX_LOG_LINES: usize = 5_000;

/// What the operator is doing in the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The run list.
    List,
    /// Typing a filter (`/`): applied as it is typed.
    Filter,
    /// `s` was pressed on this run: `y` stops it, anything else does not.
    ConfirmStop(String),
    /// Following this run's stdout and stderr (`l` or Enter; Esc goes back).
    Logs(String),
}

/// What the caller must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Pause(String),
    Resume(String),
    Stop(String),
    /// Start following this run's logs from its first event.
    OpenLogs(String),
    Quit,
}

/// A run's spending over the last refresh window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub usd_per_min: f64,
    pub tokens_per_sec: f64,
}

/// What one run had spent at one moment, for the next window's rates.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_ms: u64,
    usd: f64,
    tokens: u64,
}

/// Everything `keel top` shows.
#[derive(Debug)]
pub struct App {
    pub status: Option<StatusView>,
    /// The runs as last listed, in display order (live ones first, then newest first).
    runs: Vec<RunView>,
    rates: HashMap<String, Rates>,
    samples: HashMap<String, Sample>,
    /// When the last snapshot was taken (Unix milliseconds).
    now_ms: u64,
    /// The selected run, kept by id across refreshes.
    selected: Option<String>,
    pub filter: String,
    pub mode: Mode,
    /// The outcome of the last action, or why the last refresh failed.
    pub message: Option<String>,
    logs: Vec<String>,
    /// The seq of the last event read for the logs pane.
    pub logs_after: u64,
}

impl Default for App {
    fn default() -> App {
        App::new()
    }
}

impl App {
    pub fn new() -> App {
        App {
            status: None,
            runs: Vec::new(),
            rates: HashMap::new(),
            samples: HashMap::new(),
            now_ms: 0,
            selected: None,
            filter: String::new(),
            mode: Mode::List,
            message: None,
            logs: Vec::new(),
            logs_after: 0,
        }
    }

    /// Takes a new snapshot taken at `now_ms`. Each run's rates are its spending since
    /// the previous snapshot; a run first seen now has none yet.
    pub fn update(&mut self, status: StatusView, mut runs: Vec<RunView>, now_ms: u64) {
        let mut samples = HashMap::with_capacity(runs.len());
        let mut rates = HashMap::with_capacity(runs.len());
        for run in &runs {
            let now = Sample {
                at_ms: now_ms,
                usd: run.usage.cost_usd,
                tokens: run.usage.input_tokens + run.usage.output_tokens,
            };
            if let Some(before) = self.samples.get(&run.run_id)
                && now_ms > before.at_ms
            {
                let secs = (now_ms - before.at_ms) as f64 / 1000.0;
                rates.insert(
                    run.run_id.clone(),
                    Rates {
                        usd_per_min: (now.usd - before.usd).max(0.0) / secs * 60.0,
                        tokens_per_sec: now.tokens.saturating_sub(before.tokens) as f64 / secs,
                    },
                );
            }
            samples.insert(run.run_id.clone(), now);
        }
        // Live runs first (those an operator acts on), then the newest.
        runs.sort_by_key(|run| (!is_live(&run.state), std::cmp::Reverse(run.created_at)));
        self.status = Some(status);
        self.runs = runs;
        self.rates = rates;
        self.samples = samples;
        self.now_ms = now_ms;
        if self.selected.as_ref().is_none_or(|id| !self.visible().iter().any(|run| &run.run_id == id)) {
            self.selected = self.visible().first().map(|run| run.run_id.clone());
        }
    }

    /// The runs the filter lets through, in display order.
    pub fn visible(&self) -> Vec<&RunView> {
        let filter = self.filter.to_lowercase();
        self.runs.iter().filter(|run| filter.is_empty() || matches(run, &filter)).collect()
    }

    pub fn selected(&self) -> Option<&str> {
        self.selected.as_deref()
    }

    pub fn rates(&self, run: &str) -> Option<Rates> {
        self.rates.get(run).copied()
    }

    /// Adds a page of the followed run's events to the logs pane (its stdout and stderr).
    pub fn add_events(&mut self, events: &[EventView]) {
        for event in events {
            self.logs_after = self.logs_after.max(event.seq);
            let line = event.data.get("line").and_then(|line| line.as_str()).unwrap_or_default();
            match event.kind.as_str() {
                "stdout" => self.logs.push(line.to_owned()),
                "stderr" => self.logs.push(format!("stderr│ {line}")),
                _ => {}
            }
        }
        if self.logs.len() > MAX_LOG_LINES {
            self.logs.drain(..self.logs.len() - MAX_LOG_LINES);
        }
    }

    /// What a key does: changes the view, and answers what the caller must do.
    pub fn key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Some(Action::Quit);
        }
        match self.mode.clone() {
            Mode::Filter => {
                match key.code {
                    KeyCode::Enter => self.mode = Mode::List,
                    KeyCode::Esc => {
                        self.filter.clear();
                        self.mode = Mode::List;
                    }
                    KeyCode::Backspace => {
                        self.filter.pop();
                    }
                    KeyCode::Char(c) => self.filter.push(c),
                    _ => {}
                }
                self.keep_selection_visible();
                None
            }
            Mode::ConfirmStop(run) => {
                self.mode = Mode::List;
                if key.code == KeyCode::Char('y') || key.code == KeyCode::Char('Y') {
                    Some(Action::Stop(run))
                } else {
                    self.message = Some(format!("not stopped: {run}"));
                    None
                }
            }
            Mode::Logs(_) => {
                match key.code {
                    KeyCode::Esc | KeyCode::Char('l') => self.mode = Mode::List,
                    KeyCode::Char('q') => return Some(Action::Quit),
                    _ => {}
                }
                None
            }
            Mode::List => match key.code {
                KeyCode::Char('q') => Some(Action::Quit),
                KeyCode::Down | KeyCode::Char('j') => {
                    self.move_selection(1);
                    None
                }
                KeyCode::Up | KeyCode::Char('k') => {
                    self.move_selection(-1);
                    None
                }
                KeyCode::Char('/') => {
                    self.mode = Mode::Filter;
                    None
                }
                KeyCode::Esc => {
                    self.filter.clear();
                    self.keep_selection_visible();
                    None
                }
                KeyCode::Char('p') => self.selected.clone().map(Action::Pause),
                KeyCode::Char('r') => self.selected.clone().map(Action::Resume),
                KeyCode::Char('s') => {
                    if let Some(run) = self.selected.clone() {
                        self.mode = Mode::ConfirmStop(run);
                    }
                    None
                }
                KeyCode::Char('l') | KeyCode::Enter => {
                    let run = self.selected.clone()?;
                    self.mode = Mode::Logs(run.clone());
                    self.logs.clear();
                    self.logs_after = 0;
                    Some(Action::OpenLogs(run))
                }
                _ => None,
            },
        }
    }

    fn move_selection(&mut self, by: isize) {
        let visible = self.visible();
        if visible.is_empty() {
            return;
        }
        let at = self
            .selected
            .as_ref()
            .and_then(|id| visible.iter().position(|run| &run.run_id == id))
            .unwrap_or(0);
        let next = at.saturating_add_signed(by).min(visible.len() - 1);
        self.selected = Some(visible[next].run_id.clone());
    }

    fn keep_selection_visible(&mut self) {
        let visible = self.visible();
        if self.selected.as_ref().is_none_or(|id| !visible.iter().any(|run| &run.run_id == id)) {
            self.selected = visible.first().map(|run| run.run_id.clone());
        }
    }
}

fn is_live(state: &str) -> bool {
    !matches!(state, "succeeded" | "failed" | "cancelled")
}

fn matches(run: &RunView, filter: &str) -> bool {
    [run.run_id.as_str(), run.state.as_str(), run.tenant.as_str(), run.reason.as_deref().unwrap_or_default()]
        .iter()
        .any(|field| field.to_lowercase().contains(filter))
        || run.wait_reason.as_deref().is_some_and(|reason| reason.contains(filter))
        || run.command.join(" ").to_lowercase().contains(filter)
}

/// What a run waits for, in words: the kernel's reason (an LLM queue, a live slot, a
/// budget, an approval), else its open question or wait reason.
fn waits_for(run: &RunView) -> String {
    if let Some(reason) = &run.reason {
        return reason.clone();
    }
    match (&run.question, run.wait_reason.as_deref()) {
        (Some(question), _) => format!("human: {question}"),
        (None, Some(reason)) if run.swapped => format!("{reason} (swapped out)"),
        (None, Some(reason)) => reason.to_owned(),
        (None, None) => String::new(),
    }
}

/// Draws the whole view: the header (from `/v1/status`), then the run list or the logs
/// pane, then one line of keys, prompt or message.
pub fn draw(frame: &mut Frame, app: &App) {
    let [header, body, footer] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(3), Constraint::Length(1)])
            .areas(frame.area());
    frame.render_widget(Paragraph::new(header_lines(app)), header);
    match &app.mode {
        Mode::Logs(run) => draw_logs(frame, app, run, body),
        _ => draw_runs(frame, app, body),
    }
    frame.render_widget(Paragraph::new(footer_line(app)), footer);
}

fn header_lines(app: &App) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let Some(status) = &app.status else {
        return vec![Line::from("keel top: waiting for the kernel's first answer...")];
    };
    let max = status.max_live.map_or_else(|| "∞".to_owned(), |max| max.to_string());
    let waiting = &status.waiting;
    let mut first = vec![
        Span::styled("keel top", bold),
        Span::raw(format!("  live {}/{max}", status.live)),
        Span::raw(format!("  queued {}", status.queued)),
        Span::raw(format!(
            "  waiting: human {} approval {} budget {} message {} child {}",
            waiting.human, waiting.approval, waiting.budget, waiting.message, waiting.child
        )),
        Span::raw(format!("  swapped {}", status.swapped)),
    ];
    first.push(Span::raw(format!(
        "  store {} {}",
        status.store.backend,
        if status.store.ok { "ok" } else { "UNREACHABLE" }
    )));
    if let Some(node) = &status.node {
        first.push(Span::raw(format!("  node {node} ({} nodes)", status.nodes.len())));
    }
    let mut llm = vec![Span::styled("llm ", bold)];
    if status.providers.is_empty() {
        llm.push(Span::raw("no provider queues"));
    }
    for (i, model) in status.providers.iter().enumerate() {
        if i > 0 {
            llm.push(Span::raw("  "));
        }
        llm.push(Span::raw(format!(
            "{}/{}: {} waiting, {} in flight",
            model.provider, model.model, model.waiting, model.in_flight
        )));
        if model.limited {
            let reason = model.reason.as_deref().unwrap_or("limited");
            let reset = model.reset_in_ms.map(|ms| format!(", {}", age(ms.max(1000)))).unwrap_or_default();
            llm.push(Span::styled(format!(" ({reason}{reset})"), Style::default().fg(Color::Yellow)));
        }
    }
    let pool = &status.pool;
    let third = format!("sandbox {}: {}/{} warm", pool.tier, pool.warm, pool.target);
    vec![Line::from(first), Line::from(llm), Line::from(third)]
}

fn draw_runs(frame: &mut Frame, app: &App, area: Rect) {
    let visible = app.visible();
    let rows: Vec<Row> = visible
        .iter()
        .map(|run| {
            let rates = app.rates(&run.run_id);
            let state = if run.swapped { "swapped".to_owned() } else { run.state.clone() };
            let style =
                if is_live(&run.state) { Style::default() } else { Style::default().fg(Color::DarkGray) };
            Row::new(vec![
                run.run_id.clone(),
                run.tenant.clone(),
                state,
                age(app.now_ms.saturating_sub(run.created_at)),
                format!("${:.4}", run.usage.cost_usd),
                rates.map_or_else(|| "-".to_owned(), |r| format!("${:.4}/m", r.usd_per_min)),
                rates.map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r.tokens_per_sec)),
                waits_for(run),
                run.command.join(" "),
            ])
            .style(style)
        })
        .collect();
    let widths = [
        Constraint::Length(30),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Fill(2),
        Constraint::Fill(1),
    ];
    let header =
        Row::new(["RUN", "TENANT", "STATE", "AGE", "COST", "$/MIN", "TOK/S", "WAITS FOR", "COMMAND"])
            .style(Style::default().add_modifier(Modifier::BOLD));
    let title = if app.filter.is_empty() {
        format!(" runs ({}) ", visible.len())
    } else {
        format!(" runs ({} matching /{}) ", visible.len(), app.filter)
    };
    let table = Table::new(rows, widths)
        .header(header)
        .block(Block::default().borders(Borders::TOP).title(title))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .highlight_symbol("▶ ");
    let position = app.selected().and_then(|id| visible.iter().position(|run| run.run_id == id));
    let mut state = TableState::default().with_selected(position);
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_logs(frame: &mut Frame, app: &App, run: &str, area: Rect) {
    let block = Block::default().borders(Borders::TOP).title(format!(" logs of {run} (Esc: back) "));
    let inner = block.inner(area);
    let shown = app.logs.len().saturating_sub(inner.height as usize);
    let lines: Vec<Line> = app.logs[shown..].iter().map(|line| Line::from(line.as_str())).collect();
    let text = if lines.is_empty() { vec![Line::from("(no output yet)")] } else { lines };
    frame.render_widget(Paragraph::new(text).block(block), area);
}

fn footer_line(app: &App) -> Line<'static> {
    let prompt = Style::default().fg(Color::Black).bg(Color::Yellow);
    match &app.mode {
        Mode::Filter => Line::from(vec![
            Span::styled(format!("/{}", app.filter), prompt),
            Span::raw("  Enter: keep  Esc: clear"),
        ]),
        Mode::ConfirmStop(run) => Line::from(Span::styled(format!("stop {run}? (y/n)"), prompt)),
        Mode::Logs(_) => Line::from("Esc/l: back to runs  q: quit"),
        Mode::List => match &app.message {
            Some(message) => Line::from(message.clone()),
            None => {
                Line::from("↑↓/jk: select  p: pause  r: resume  s: stop  l/Enter: logs  /: filter  q: quit")
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use keel_protocol::api::{
        PoolStatusView, ProviderStatusView, StatusWaitingView, StoreStatusView, UsageView,
    };
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::KeyEventKind;
    use serde_json::json;

    use super::*;

    fn status() -> StatusView {
        StatusView {
            node: None,
            live: 2,
            max_live: Some(3),
            queued: 1,
            waiting: StatusWaitingView { human: 1, approval: 0, budget: 0, message: 0, child: 0 },
            swapped: 0,
            providers: vec![ProviderStatusView {
                provider: "openai".into(),
                model: "m".into(),
                waiting: 1,
                in_flight: 0,
                limited: true,
                reason: Some("requests limit".into()),
                reset_in_ms: Some(41_000),
            }],
            pool: PoolStatusView { tier: "process".into(), warm: 2, target: 2 },
            nodes: Vec::new(),
            store: StoreStatusView { backend: "sqlite".into(), ok: true },
        }
    }

    fn run(id: &str, tenant: &str, state: &str, created_at: u64, usd: f64, tokens: u64) -> RunView {
        serde_json::from_value(json!({
            "run_id": id, "tenant": tenant, "state": state, "command": ["python3", "agent.py"],
            "created_at": created_at, "updated_at": created_at, "attempt": 1, "provider_calls": 0,
            "usage": {"input_tokens": tokens, "output_tokens": 0, "llm_calls": 0, "tool_calls": 0, "cost_usd": usd},
        }))
        .unwrap()
    }

    fn press(app: &mut App, code: KeyCode) -> Option<Action> {
        app.key(KeyEvent { kind: KeyEventKind::Press, ..KeyEvent::new(code, KeyModifiers::NONE) })
    }

    /// The screen as text, one string per row.
    fn screen(app: &App, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| draw(frame, app)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| (0..width).map(|x| buffer[(x, y)].symbol()).collect::<String>().trim_end().to_owned())
            .collect()
    }

    fn two_snapshots() -> App {
        let mut app = App::new();
        let mut asking = run("run_asking", "acme", "waiting", 1_000, 0.0, 0);
        asking.wait_reason = Some("human".into());
        asking.question = Some("approve?".into());
        let mut queued = run("run_queued", "default", "queued", 2_000, 0.0, 0);
        queued.reason = Some("queued: 1 of 1 waiting for a live slot (2 live)".into());
        let done = run("run_done", "default", "succeeded", 5_000, 0.5, 900);
        app.update(
            status(),
            vec![
                run("run_busy", "acme", "running", 3_000, 0.01, 0),
                asking.clone(),
                queued.clone(),
                done.clone(),
            ],
            60_000,
        );
        // A minute later the busy run spent two cents more and 600 tokens.
        let busy = RunView {
            usage: UsageView { input_tokens: 600, cost_usd: 0.03, ..UsageView::default() },
            ..run("run_busy", "acme", "running", 3_000, 0.0, 0)
        };
        app.update(status(), vec![done, queued, asking, busy], 120_000);
        app
    }

    #[test]
    fn the_header_and_rows_show_counts_states_rates_and_what_runs_wait_for() {
        let app = two_snapshots();
        let rows = screen(&app, 200, 12);
        assert!(
            rows[0].contains("live 2/3  queued 1  waiting: human 1 approval 0 budget 0 message 0 child 0"),
            "{rows:#?}"
        );
        assert!(rows[0].contains("store sqlite ok"), "{rows:#?}");
        assert!(rows[1].contains("openai/m: 1 waiting, 0 in flight (requests limit, 41s)"), "{rows:#?}");
        assert!(rows[2].contains("sandbox process: 2/2 warm"), "{rows:#?}");
        let text = rows.join("\n");
        let busy = rows.iter().find(|row| row.contains("run_busy")).unwrap();
        assert!(busy.contains("running") && busy.contains("$0.0300") && busy.contains("$0.0200/m"), "{busy}");
        assert!(busy.contains("10.0"), "600 tokens in 60 s: {busy}");
        assert!(busy.contains("1m"), "created a minute and 57 s ago: {busy}");
        let asking = rows.iter().find(|row| row.contains("run_asking")).unwrap();
        assert!(asking.contains("waiting") && asking.contains("human: approve?"), "{asking}");
        let queued = rows.iter().find(|row| row.contains("run_queued")).unwrap();
        assert!(queued.contains("queued: 1 of 1 waiting for a live slot"), "{queued}");
        // Live runs come first, newest first; the ended run last.
        let order: Vec<usize> = ["run_busy", "run_queued", "run_asking", "run_done"]
            .iter()
            .map(|id| text.find(id).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{rows:#?}");
        assert!(rows.iter().any(|row| row.contains("▶ run_busy")), "the first run is selected: {rows:#?}");
        assert!(rows[11].contains("s: stop"), "the keys: {rows:#?}");
    }

    #[test]
    fn keys_select_confirm_a_stop_and_filter() {
        let mut app = two_snapshots();
        assert_eq!(app.selected(), Some("run_busy"));
        assert_eq!(press(&mut app, KeyCode::Char('j')), None);
        assert_eq!(press(&mut app, KeyCode::Down), None);
        assert_eq!(app.selected(), Some("run_asking"));
        assert_eq!(press(&mut app, KeyCode::Char('k')), None);
        assert_eq!(app.selected(), Some("run_queued"));
        assert_eq!(press(&mut app, KeyCode::Char('p')), Some(Action::Pause("run_queued".into())));
        assert_eq!(press(&mut app, KeyCode::Char('r')), Some(Action::Resume("run_queued".into())));
        // A stop asks first; anything but y leaves the run alone.
        assert_eq!(press(&mut app, KeyCode::Char('s')), None);
        assert!(screen(&app, 200, 12)[11].contains("stop run_queued? (y/n)"));
        assert_eq!(press(&mut app, KeyCode::Char('n')), None);
        assert_eq!(app.mode, Mode::List);
        assert_eq!(press(&mut app, KeyCode::Char('s')), None);
        assert_eq!(press(&mut app, KeyCode::Char('y')), Some(Action::Stop("run_queued".into())));
        // A filter narrows the list as it is typed; the selection follows.
        assert_eq!(press(&mut app, KeyCode::Char('/')), None);
        for c in "acme".chars() {
            press(&mut app, KeyCode::Char(c));
        }
        assert_eq!(app.visible().len(), 2);
        assert_eq!(app.selected(), Some("run_busy"), "the queued run is filtered out");
        press(&mut app, KeyCode::Enter);
        let rows = screen(&app, 200, 12);
        assert!(rows.iter().any(|row| row.contains("runs (2 matching /acme)")), "{rows:#?}");
        assert!(!rows[..11].join("\n").contains("run_queued"), "only the footer names it: {rows:#?}");
        assert_eq!(rows[11], "not stopped: run_queued", "the n's outcome stays on the message line");
        press(&mut app, KeyCode::Esc);
        assert_eq!(app.visible().len(), 4, "Esc clears the filter");
        assert_eq!(press(&mut app, KeyCode::Char('q')), Some(Action::Quit));
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(app.key(ctrl_c), Some(Action::Quit));
    }

    #[test]
    fn the_logs_pane_follows_stdout_and_stderr_and_esc_goes_back() {
        let mut app = two_snapshots();
        assert_eq!(press(&mut app, KeyCode::Enter), Some(Action::OpenLogs("run_busy".into())));
        assert!(screen(&app, 120, 10).join("\n").contains("(no output yet)"));
        let event = |seq: u64, kind: &str, line: &str| EventView {
            seq,
            ts: 0,
            kind: kind.into(),
            data: json!({ "line": line }),
        };
        let events: Vec<EventView> = (1..=10).map(|i| event(i, "stdout", &format!("line {i}"))).collect();
        app.add_events(&events);
        app.add_events(&[event(11, "state", ""), event(12, "stderr", "oops")]);
        assert_eq!(app.logs_after, 12);
        let rows = screen(&app, 120, 10);
        assert!(rows[3].contains("logs of run_busy (Esc: back)"), "{rows:#?}");
        // Five lines fit: the newest are shown, the state event is not a log line.
        assert_eq!(&rows[4..9], ["line 7", "line 8", "line 9", "line 10", "stderr│ oops"], "{rows:#?}");
        assert_eq!(press(&mut app, KeyCode::Esc), None);
        assert_eq!(app.mode, Mode::List);
        assert!(screen(&app, 120, 10).join("\n").contains("run_busy"));
    }
}
