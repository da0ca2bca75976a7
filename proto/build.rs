//! Generates the relay frame types from `proto/relay/v1/relay.proto` with protox (a pure-Rust
//! protobuf compiler) and prost-build: no network access and no system `protoc`. Without the
//! `relay` feature there is nothing to generate (and protox and prost-build are not built).

#[cfg(feature = "relay")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let schema = "proto/relay/v1/relay.proto";
    println!("cargo:rerun-if-changed={schema}");
    let descriptors = protox::compile([schema], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}

#[cfg(not(feature = "relay"))]
fn main() {}
