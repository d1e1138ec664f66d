//! An interpreter worker for this crate's tests (`tests/it` starts its kernels' pools
//! with it); the `keel` binary runs `keel_interp::worker_main` itself instead.

fn main() {
    keel_interp::worker_main()
}
