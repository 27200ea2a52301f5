//! The allocators under test ("contenders"): glibc's malloc (no preload),
//! Canopy (`LD_PRELOAD=libcanopy_malloc.so`) and the anchors jemalloc,
//! mimalloc and tcmalloc, preloaded from their Debian packages.
//!
//! A missing anchor is not an error: when we are root and `apt-get` exists it
//! is installed, otherwise the harness says which package to install and goes
//! on without it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Result};
use serde::Serialize;

use crate::artifacts::{Lookup, CANOPY_MALLOC};

/// An anchor allocator packaged by Debian.
#[derive(Debug, Clone, Copy)]
pub struct AnchorSpec {
    /// Contender name.
    pub name: &'static str,
    /// The shared object to preload.
    pub lib: &'static str,
    /// The Debian package that ships it.
    pub package: &'static str,
}

/// The anchors, in report order.
pub const ANCHORS: &[AnchorSpec] = &[
    AnchorSpec {
        name: "jemalloc",
        lib: "libjemalloc.so.2",
        package: "libjemalloc2",
    },
    AnchorSpec {
        name: "mimalloc",
        lib: "libmimalloc.so.2",
        package: "libmimalloc2.0",
    },
    AnchorSpec {
        name: "tcmalloc",
        lib: "libtcmalloc_minimal.so.4",
        package: "libtcmalloc-minimal4",
    },
];

/// Every contender name, in report order.
pub const ALL_NAMES: &[&str] = &["glibc", "canopy", "jemalloc", "mimalloc", "tcmalloc"];

/// One allocator under test.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Contender {
    /// `glibc`, `canopy`, `jemalloc`, ...
    pub name: String,
    /// The library preloaded for it; `None` for glibc.
    pub preload: Option<PathBuf>,
    /// Package version or build description, for the report.
    pub version: Option<String>,
}

impl Contender {
    /// glibc's allocator: nothing preloaded.
    pub fn glibc() -> Self {
        Contender {
            name: "glibc".into(),
            preload: None,
            version: glibc_version(),
        }
    }

    /// Is this Canopy (whose rich interface is available)?
    pub fn is_canopy(&self) -> bool {
        self.name == "canopy"
    }

    /// Is this one of the anchors (every contender but Canopy)?
    pub fn is_anchor(&self) -> bool {
        !self.is_canopy()
    }
}

/// Directories searched for anchor libraries.
pub fn lib_dirs() -> Vec<PathBuf> {
    let triple = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    [
        triple.as_str(),
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// Where an anchor's library is installed, if it is.
pub fn find_anchor(spec: &AnchorSpec) -> Option<PathBuf> {
    lib_dirs()
        .into_iter()
        .map(|d| d.join(spec.lib))
        .find(|p| p.exists())
}

/// The installed version of a Debian package.
pub fn package_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", package])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !v.is_empty()).then_some(v)
}

fn glibc_version() -> Option<String> {
    // SAFETY: gnu_get_libc_version returns a pointer to a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    Some(format!("glibc {}", v.to_string_lossy()))
}

extern "C" {
    fn gnu_get_libc_version() -> *const libc::c_char;
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have_apt() -> bool {
    Path::new("/usr/bin/apt-get").exists()
}

/// Install Debian packages with apt-get (running `apt-get update` first when
/// the plain install fails).  Errors when not root or without apt-get.
pub fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    if !is_root() || !have_apt() {
        bail!(
            "cannot install {} here (needs root and apt-get): run `apt-get install {}`",
            packages.join(" "),
            packages.join(" ")
        );
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    let sp = crate::progress::spinner(format!("apt-get install -y {}", packages.join(" ")));
    let mut ok = install().map(|s| s.success()).unwrap_or(false);
    if !ok {
        sp.set_message(format!(
            "apt-get update, then apt-get install -y {}",
            packages.join(" ")
        ));
        let _ = Command::new("apt-get")
            .arg("update")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        ok = install().map(|s| s.success()).unwrap_or(false);
    }
    sp.finish_and_clear();
    if !ok {
        bail!("apt-get install {} failed", packages.join(" "));
    }
    Ok(())
}

/// How contenders are gathered.
#[derive(Debug, Clone)]
pub struct Discover {
    /// Contender names wanted (a subset of [`ALL_NAMES`]).
    pub wanted: Vec<String>,
    /// Install missing anchors with apt-get when possible.
    pub install: bool,
    /// How to look for libcanopy_malloc.so.
    pub canopy_lookup: Lookup,
}

impl Default for Discover {
    fn default() -> Self {
        Discover {
            wanted: ALL_NAMES.iter().map(|s| s.to_string()).collect(),
            install: true,
            canopy_lookup: Lookup::FindOrBuild,
        }
    }
}

/// The contenders found, and a warning for each one that was skipped.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Contenders {
    /// Available contenders, in report order (glibc first).
    pub list: Vec<Contender>,
    /// Why each missing contender was skipped.
    pub skipped: Vec<String>,
}

impl Contenders {
    /// Look for every wanted contender.
    pub fn discover(opts: &Discover) -> Result<Self> {
        for w in &opts.wanted {
            if !ALL_NAMES.contains(&w.as_str()) {
                bail!("unknown contender {w:?} (known: {})", ALL_NAMES.join(", "));
            }
        }
        let wants = |n: &str| opts.wanted.iter().any(|w| w == n);
        let mut out = Contenders::default();
        if wants("glibc") {
            out.list.push(Contender::glibc());
        }
        if wants("canopy") {
            match CANOPY_MALLOC.locate(opts.canopy_lookup) {
                Ok(paths) => out.list.push(Contender {
                    name: "canopy".into(),
                    preload: Some(paths[0].clone()),
                    version: Some(format!(
                        "canopy {} ({})",
                        env!("CARGO_PKG_VERSION"),
                        paths[0].display()
                    )),
                }),
                Err(e) => out.skipped.push(format!("canopy: {e:#}")),
            }
        }
        let missing: Vec<&AnchorSpec> = ANCHORS
            .iter()
            .filter(|a| wants(a.name) && find_anchor(a).is_none())
            .collect();
        if !missing.is_empty() && opts.install && is_root() && have_apt() {
            let pkgs: Vec<&str> = missing.iter().map(|a| a.package).collect();
            if let Err(e) = apt_install(&pkgs) {
                eprintln!("warning: {e:#}");
            }
        }
        for a in ANCHORS.iter().filter(|a| wants(a.name)) {
            match find_anchor(a) {
                Some(p) => out.list.push(Contender {
                    name: a.name.into(),
                    preload: Some(p),
                    version: package_version(a.package).map(|v| format!("{} {v}", a.package)),
                }),
                None => out.skipped.push(format!(
                    "{}: {} not found; install the Debian package with `apt-get install {}`",
                    a.name, a.lib, a.package
                )),
            }
        }
        Ok(out)
    }

    /// The contender called `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Contender> {
        self.list.iter().find(|c| c.name == name)
    }

    /// Print the skip warnings to standard error.
    pub fn warn_skipped(&self) {
        for s in &self.skipped {
            eprintln!("warning: skipping contender {s}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_has_no_preload() {
        let g = Contender::glibc();
        assert!(g.preload.is_none());
        assert!(g.is_anchor());
        assert!(g.version.unwrap().starts_with("glibc "));
    }

    #[test]
    fn unknown_contender_is_an_error() {
        let opts = Discover {
            wanted: vec!["hoard".into()],
            install: false,
            canopy_lookup: Lookup::FindOnly,
        };
        assert!(Contenders::discover(&opts).is_err());
    }

    #[test]
    fn glibc_only() {
        let opts = Discover {
            wanted: vec!["glibc".into()],
            install: false,
            canopy_lookup: Lookup::FindOnly,
        };
        let c = Contenders::discover(&opts).unwrap();
        assert_eq!(c.list.len(), 1);
        assert!(c.skipped.is_empty());
    }
}
