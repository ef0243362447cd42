//! The `storage-lock` binary; everything lives in the `storage_lock_cli` library.

fn main() -> std::process::ExitCode {
    storage_lock_cli::main()
}
