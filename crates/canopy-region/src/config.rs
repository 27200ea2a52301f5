//! Sizes and watermarks of a region allocator (002 §3.2, §4.2).

use crate::RegionError;

/// The shape of a region allocator.  Every size is a power of two.
///
/// | field | default | `CANOPY_*` variable | meaning |
/// |---|---|---|---|
/// | `granule` | 64 B | `CANOPY_REGION_GRANULE` | slot sizes from the granule up are multiples of it (a cache line in Myrmics) |
/// | `min_slot` | 16 B | `CANOPY_REGION_MIN_SLOT` | slot sizes below the granule are multiples of this; equal to the granule, every slot size is a granule multiple, as in Myrmics.  A slab holds at most 4096 slots: from the environment, a slab above 64 KiB raises it to slab / 4096 (at most the granule) unless it is set |
/// | `slab_size` | 4 KiB | `CANOPY_REGION_SLAB` | a slab: slots of one size; larger objects span consecutive slabs |
/// | `page_size` | 1 MiB | `CANOPY_REGION_PAGE` | what the allocator takes from its page source at a time |
/// | `high_watermark` | 8 | `CANOPY_REGION_HIGH` | empty slabs a region keeps for itself |
/// | `low_watermark` | 1 | `CANOPY_REGION_LOW` | empty slabs a region keeps when memory is short |
/// | `max_pages` | unlimited | `CANOPY_REGION_MAX_PAGES` | pages the allocator may take in all |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Slot sizes from the granule up are multiples of this.
    pub granule: usize,
    /// Slot sizes below the granule are multiples of this (16 B by default:
    /// a 16 B object takes a 16 B slot, not a 64 B one).  Set it to the
    /// granule for Myrmics' layout, where every slot size is a granule
    /// multiple.
    pub min_slot: usize,
    /// Bytes per slab.
    pub slab_size: usize,
    /// Bytes per page taken from the page source.
    pub page_size: usize,
    /// Empty slabs a region keeps (and takes at once when it grows and
    /// memory is plentiful).
    pub high_watermark: usize,
    /// Empty slabs a region is left with when others need memory.
    pub low_watermark: usize,
    /// Upper bound on pages taken from the source (`usize::MAX`: none).
    pub max_pages: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            granule: 64,
            min_slot: 16,
            slab_size: 4096,
            page_size: 1 << 20,
            high_watermark: 8,
            low_watermark: 1,
            max_pages: usize::MAX,
        }
    }
}

impl Config {
    /// The defaults, overridden by the `CANOPY_REGION_*` variables above.
    /// A variable that does not parse is an error naming it.
    pub fn from_env() -> Result<Config, RegionError> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables looked up by `var`.
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config, RegionError> {
        let mut c = Config::default();
        let vars: [(&str, &mut usize); 7] = [
            ("CANOPY_REGION_GRANULE", &mut c.granule),
            ("CANOPY_REGION_MIN_SLOT", &mut c.min_slot),
            ("CANOPY_REGION_SLAB", &mut c.slab_size),
            ("CANOPY_REGION_PAGE", &mut c.page_size),
            ("CANOPY_REGION_HIGH", &mut c.high_watermark),
            ("CANOPY_REGION_LOW", &mut c.low_watermark),
            ("CANOPY_REGION_MAX_PAGES", &mut c.max_pages),
        ];
        let mut min_slot_given = false;
        for (name, slot) in vars {
            if let Some(v) = var(name) {
                *slot = parse_size(&v)
                    .ok_or_else(|| RegionError::BadConfig(format!("{name}={v:?} is not a size (e.g. 4096, 64K, 1M)")))?;
                min_slot_given |= name == "CANOPY_REGION_MIN_SLOT";
            }
        }
        if !min_slot_given {
            // A slab holds at most 4096 slots: with large slabs the smallest
            // slot grows (up to the granule) unless it was set.  A power of
            // two, so a bad slab size is reported as that, not as a bad
            // smallest slot.
            c.min_slot = c.min_slot.max((c.slab_size / 4096).next_power_of_two()).min(c.granule.max(16));
        }
        c.validate()?;
        Ok(c)
    }

    /// Check the sizes fit together.
    pub fn validate(&self) -> Result<(), RegionError> {
        let bad = |m: String| Err(RegionError::BadConfig(m));
        if !self.granule.is_power_of_two() || self.granule < 16 {
            return bad(format!("granule {} must be a power of two of at least 16", self.granule));
        }
        if !self.min_slot.is_power_of_two() || self.min_slot < 16 || self.min_slot > self.granule {
            return bad(format!(
                "smallest slot {} must be a power of two, at least 16 and at most the granule {}",
                self.min_slot, self.granule
            ));
        }
        if !self.slab_size.is_power_of_two() || self.slab_size < self.granule || self.slab_size < 4096 {
            return bad(format!(
                "slab size {} must be a power of two, at least 4096 and at least the granule",
                self.slab_size
            ));
        }
        if self.slab_size > 1 << 20 {
            return bad(format!("slab size {} is above 1 MiB", self.slab_size));
        }
        if self.slab_size / self.min_slot > 4096 {
            let least = self.slab_size / 4096;
            return bad(format!(
                "slab size / smallest slot = {} slots is more than 4096: make {} at least {least} B",
                self.slab_size / self.min_slot,
                // The smallest slot is at most the granule.
                if least > self.granule { "the granule and the smallest slot" } else { "the smallest slot" }
            ));
        }
        if !self.page_size.is_power_of_two() || self.page_size < self.slab_size {
            return bad(format!("page size {} must be a power of two and at least the slab size", self.page_size));
        }
        if self.page_size / self.slab_size > 1 << 16 {
            return bad(format!("page size {} holds more than 65536 slabs", self.page_size));
        }
        if self.low_watermark > self.high_watermark {
            return bad(format!(
                "low watermark {} is above the high watermark {}",
                self.low_watermark, self.high_watermark
            ));
        }
        if self.max_pages == 0 {
            return bad("max_pages is 0".into());
        }
        Ok(())
    }
}

/// `4096`, `64K`, `1M`, `2G` (binary multiples).
pub(crate) fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}
