//! One process-wide region allocator behind a lock, for the C API and for
//! programs that want regions shared by threads without managing an
//! allocator themselves.  Its configuration comes from the `CANOPY_REGION_*`
//! variables ([`Config::from_env`]) on first use.

use std::sync::Mutex;

use crate::{Config, RegionAllocator, RegionError};

static GLOBAL: Mutex<Option<RegionAllocator>> = Mutex::new(None);

/// Run `f` on the process-wide allocator (made on first use).  Fails only
/// if the `CANOPY_REGION_*` configuration is invalid.
pub fn with<R>(f: impl FnOnce(&mut RegionAllocator) -> R) -> Result<R, RegionError> {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        *g = Some(RegionAllocator::with_config(Config::from_env()?)?);
    }
    Ok(f(g.as_mut().expect("made above")))
}
