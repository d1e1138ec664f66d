//! A worker binary for this crate's tests and benches; the `keel` binary runs
//! `keel_interp::worker_main` itself when `argv[1]` is `keel_interp::WORKER_ARG`.

fn main() {
    keel_interp::worker_main()
}
