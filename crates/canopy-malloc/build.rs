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
        // Relative relocations packed (DT_RELR): 1.2 KiB of tables where
        // `.rela.dyn` took 42 KiB, in the segment the loader reads at start
        // (whose pages count in every process's RSS).  The loader must know
        // DT_RELR (glibc 2.36), so only where the C library the library is
        // built against does; building for another machine, never.
        if relr_supported() {
            println!("cargo:rustc-cdylib-link-arg=-Wl,-z,pack-relative-relocs");
        }
    }
}

/// Whether the machine the library is built for runs a glibc that loads
/// DT_RELR (2.36 or later): a native build only, asked of `getconf`.
fn relr_supported() -> bool {
    println!("cargo:rerun-if-env-changed=CANOPY_NO_RELR");
    if std::env::var_os("CANOPY_NO_RELR").is_some() {
        return false;
    }
    if std::env::var("HOST").ok() != std::env::var("TARGET").ok() {
        return false;
    }
    let Ok(out) = std::process::Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = text.trim().trim_start_matches("glibc").trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    out.status.success() && (major, minor) >= (2, 36)
}
