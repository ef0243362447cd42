//! Compiles `proto/storagelock/v1/lock.proto` with protox (pure Rust, no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/storagelock/v1/lock.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
