//! Errors of the region API.  Every bad call is refused with one of these and
//! changes nothing.

use core::fmt;

use crate::RegionId;

/// What was wrong with a region call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// No region with this id ever existed in this allocator.
    UnknownRegion(RegionId),
    /// The region existed but has been freed (directly or with an ancestor).
    FreedRegion(RegionId),
    /// The root region exists for the allocator's whole life.
    RootNotFreeable,
    /// The pointer is not inside memory any region of this allocator owns.
    NotOwned(usize),
    /// The pointer is inside a region's memory but no object is allocated at it
    /// (already freed, or never handed out).
    NotAllocated {
        /// The pointer.
        ptr: usize,
        /// The region whose memory it is in.
        region: RegionId,
    },
    /// The pointer is inside a live object but not at its start.
    Interior {
        /// The pointer.
        ptr: usize,
        /// Start of the slot or object that contains it.
        object: usize,
        /// The region that owns the object.
        region: RegionId,
    },
    /// The page source could not supply memory.
    OutOfMemory {
        /// The request.
        size: usize,
        /// The region asked.
        region: RegionId,
    },
    /// A size the allocator cannot express (overflow).
    SizeTooLarge(usize),
    /// An argument that can never be valid (a null array, id 0).
    Invalid(String),
    /// The configuration is inconsistent.
    BadConfig(String),
    /// Unpacking: the packed data does not fit this allocator (different
    /// slab size, memory or region ids already in use, page not obtainable).
    Unpack(String),
    /// A packed message is malformed.
    Malformed(String),
    /// A session of the process-wide allocator ([`crate::global`]) was
    /// misused: not open, open on another thread, or a call that would wait
    /// for the lock this thread's own open session holds.
    Session(String),
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::UnknownRegion(r) => write!(f, "region {r} does not exist"),
            RegionError::FreedRegion(r) => write!(f, "region {r} has been freed"),
            RegionError::RootNotFreeable => write!(f, "the root region cannot be freed"),
            RegionError::NotOwned(p) => write!(f, "{p:#x} is not in memory owned by any region"),
            RegionError::NotAllocated { ptr, region } => {
                write!(f, "{ptr:#x} in region {region} is not an allocated object (double free?)")
            }
            RegionError::Interior { ptr, object, region } => {
                write!(f, "{ptr:#x} is inside the object at {object:#x} of region {region}, not at its start")
            }
            RegionError::OutOfMemory { size, region } => {
                write!(f, "out of memory allocating {size} bytes in region {region}")
            }
            RegionError::SizeTooLarge(s) => write!(f, "size {s} is too large"),
            RegionError::Invalid(m) => write!(f, "invalid argument: {m}"),
            RegionError::BadConfig(m) => write!(f, "bad region configuration: {m}"),
            RegionError::Unpack(m) => write!(f, "cannot unpack: {m}"),
            RegionError::Malformed(m) => write!(f, "malformed packed region: {m}"),
            RegionError::Session(m) => write!(f, "region session: {m}"),
        }
    }
}

impl std::error::Error for RegionError {}
