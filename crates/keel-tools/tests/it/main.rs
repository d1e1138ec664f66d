//! keel-tools against real sandboxes. The process sandbox re-executes this binary as its
//! zygote, so `main` hands over to it first (before any thread starts) and otherwise runs
//! the tests itself (`harness = false`); `cargo test -p keel-tools --test it NAME` runs
//! the tests whose name contains NAME.

mod command;

use std::future::Future;
use std::pin::Pin;

type Test = (&'static str, fn() -> Pin<Box<dyn Future<Output = ()> + Send>>);

fn main() {
    keel_sandbox::zygote::run_if_requested();
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in command::TESTS {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let result = runtime.block_on(async { tokio::spawn(async move { test().await }).await });
        match result {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    println!("\n{ran} tests, {} failed", failed.len());
    if !failed.is_empty() {
        println!("failed: {failed:?}");
        std::process::exit(1);
    }
}
