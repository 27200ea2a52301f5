fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=hot-text.ld");
    println!("cargo:rerun-if-env-changed=CANOPY_NO_HOT_TEXT");
    if os == "linux" && env == "gnu" {
        // The unwinder Rust's std needs, linked in: the library then needs
        // no libgcc_s (80-100 KiB of resident pages in every process).
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
        // The code every process runs, gathered in one section (see
        // hot-text.ld).  CANOPY_NO_HOT_TEXT=1 leaves the layout to the
        // linker (for a linker without INSERT support, such as gold).
        if std::env::var_os("CANOPY_NO_HOT_TEXT").is_none() {
            let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-T,{dir}/hot-text.ld");
            // The code segment on a 64 KiB boundary in the file and in
            // memory (the loader aligns the library to its segments'
            // alignment), so that the hot section is one fault-around window.
            println!("cargo:rustc-cdylib-link-arg=-Wl,-z,max-page-size=0x10000");
            println!("cargo:rustc-cdylib-link-arg=-Wl,-z,separate-loadable-segments");
        }
    }
}
