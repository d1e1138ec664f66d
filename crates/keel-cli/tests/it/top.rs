//! `keel top` (issue 14) in a real terminal: the binary runs under `tmux` (a server of the
//! test's own), keys go in with `send-keys` and the screen comes back with
//! `capture-pane`, polled until the text appears. A run started with `keel run -d`
//! shows with its state; selecting it and pressing `s` then `y` stops it (checked through
//! the API); `q` quits and leaves the terminal as it was. A tenant's token shows that
//! tenant's runs only. Without a daemon, `keel top` says to start `keel serve`.

use std::process::{Command, Output};

use crate::harness::{Keel, agent, wait_for};

/// A tmux server of this test's own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(name: &str) -> Tmux {
        Tmux { socket: format!("keel-test-{name}-{}", std::process::id()) }
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux (is it installed?)")
    }

    /// Starts `keel top` in a 200x40 window; when it exits, the shell prints its status
    /// and the terminal's line discipline modes, and stays (so the screen can be read).
    fn start_top(&self, keel: &Keel, token: Option<&str>) {
        let token = token.map(|token| format!("KEEL_API_TOKEN='{token}' ")).unwrap_or_default();
        let script = format!(
            "KEEL_DATA_DIR='{}' {token}'{}' top --interval 0.2; echo \"top exited=$?\"; \
             stty -a | tr ' ;' '\\n\\n' | grep -E '^-?(icanon|echo|isig)$' | tr '\\n' ' '; echo; sleep 600",
            keel.data.path().display(),
            env!("CARGO_BIN_EXE_keel"),
        );
        let out =
            self.tmux(&["new-session", "-d", "-x", "200", "-y", "40", "-s", "top", "sh", "-c", &script]);
        assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Polls the screen until `check` finds what it wants.
    fn wait_screen<T>(&self, what: &str, mut check: impl FnMut(&str) -> Option<T>) -> T {
        let mut last = String::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(what, || {
                last = self.screen();
                check(&last)
            })
        }));
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}; the screen:\n{last}"))
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        let out = self.tmux(&args);
        assert!(out.status.success(), "tmux send-keys: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn alternate_screen_on(&self) -> bool {
        let out = self.tmux(&["display-message", "-p", "-t", "top", "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The screen's line showing `run`.
fn line_of<'a>(screen: &'a str, run: &str) -> Option<&'a str> {
    screen.lines().find(|line| line.contains(run))
}

fn receiver(keel: &Keel) -> String {
    keel.detach(&[
        "--sandbox",
        "none",
        "--input",
        r#"{"recv": true}"#,
        "--",
        "python3",
        &agent("proc_agent.py"),
    ])
}

#[test]
fn top_shows_a_run_stops_the_selected_one_on_s_y_and_quits_restoring_the_terminal() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none"]);
    let older = receiver(&keel);
    keel.wait_state(&older, &["waiting"]);
    let newer = receiver(&keel);
    keel.wait_state(&newer, &["waiting"]);

    let tmux = Tmux::new("top");
    tmux.start_top(&keel, None);
    // Both runs show, waiting for a message; the newest first and selected.
    let screen = tmux.wait_screen("both runs on the screen", |screen| {
        (line_of(screen, &older).is_some() && line_of(screen, &newer).is_some()).then(|| screen.to_owned())
    });
    assert!(tmux.alternate_screen_on(), "keel top draws on the alternate screen");
    assert!(screen.contains("live 2/∞"), "{screen}");
    assert!(screen.contains("waiting: human 0 approval 0 budget 0 message 2 child 0"), "{screen}");
    for run in [&older, &newer] {
        let line = line_of(&screen, run).unwrap();
        assert!(line.contains("waiting") && line.contains("message"), "{line}");
    }
    assert!(line_of(&screen, &newer).unwrap().contains('▶'), "the newest run is selected:\n{screen}");

    // Down to the older run, then stop it: a question first, then `y`.
    tmux.keys(&["j"]);
    tmux.wait_screen("the older run to be selected", |screen| {
        line_of(screen, &older)?.contains('▶').then_some(())
    });
    tmux.keys(&["s"]);
    tmux.wait_screen("the stop to be asked", |screen| {
        screen.contains(&format!("stop {older}? (y/n)")).then_some(())
    });
    tmux.keys(&["y"]);
    let view = keel.wait_state(&older, &["cancelled", "failed", "succeeded"]);
    assert_eq!(view["state"], "cancelled", "{view}");
    assert_eq!(keel.inspect(&newer)["state"], "waiting", "the other run was left alone");
    let ps = keel.ok(&["ps"]);
    assert!(line_of(&ps, &older).is_some_and(|line| line.contains("cancelled")), "{ps}");
    tmux.wait_screen("the stopped run to show cancelled", |screen| {
        line_of(screen, &older)?.contains("cancelled").then_some(())
    });

    // `l` follows the selected run's logs; Esc goes back.
    tmux.keys(&["l"]);
    tmux.wait_screen("the logs pane", |screen| screen.contains(&format!("logs of {older}")).then_some(()));
    tmux.keys(&["Escape"]);
    tmux.wait_screen("the run list again", |screen| line_of(screen, &newer).map(drop));

    // `q` quits: the shell after it sees status 0, the normal screen and cooked mode.
    tmux.keys(&["q"]);
    let screen = tmux.wait_screen("keel top to exit", |screen| {
        screen.lines().any(|line| line.contains("icanon")).then(|| screen.to_owned())
    });
    assert!(screen.contains("top exited=0"), "{screen}");
    assert!(!tmux.alternate_screen_on(), "the alternate screen was left");
    let modes = screen.lines().find(|line| line.contains("icanon")).unwrap();
    let modes: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(modes.contains(&mode), "the terminal is back in {mode} mode: {modes:?}");
    }
}

#[test]
fn top_with_a_tenant_token_shows_that_tenants_runs_only() {
    let mut keel = Keel::new();
    keel.start_daemon_with(&["--sandbox", "none"]);
    keel.ok(&["tenant", "create", "acme"]);
    let acme = keel.ok(&["tenant", "token", "acme"]).trim().to_owned();
    let operators = receiver(&keel);
    let out = keel
        .cmd()
        .env("KEEL_API_TOKEN", &acme)
        .args([
            "run",
            "--detach",
            "--json",
            "--sandbox",
            "none",
            "--input",
            r#"{"recv": true}"#,
            "--",
            "python3",
        ])
        .arg(agent("proc_agent.py"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let acmes = value["run_id"].as_str().unwrap().to_owned();
    keel.wait_state(&acmes, &["waiting"]);
    keel.wait_state(&operators, &["waiting"]);

    let tmux = Tmux::new("top-tenant");
    tmux.start_top(&keel, Some(&acme));
    let screen = tmux.wait_screen("acme's run", |screen| line_of(screen, &acmes).map(|_| screen.to_owned()));
    assert!(!screen.contains(&operators), "another tenant's run shows:\n{screen}");
    assert!(screen.contains("live 1/∞"), "acme's own count:\n{screen}");
    tmux.keys(&["q"]);
    tmux.wait_screen("keel top to exit", |screen| screen.contains("top exited=0").then_some(()));
}

#[test]
fn top_without_a_daemon_says_to_start_keel_serve() {
    let keel = Keel::new();
    let out = keel.run(&["top"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no Keel daemon is running") && stderr.contains("keel serve"), "{stderr}");
    let out = keel.run(&["top", "--interval", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--interval must be at least 0.1"));
}
