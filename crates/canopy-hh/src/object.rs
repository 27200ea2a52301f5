//! The managed object model: values, object kinds and the header word.
//!
//! A *value* is one 64-bit word: an unboxed integer (low bit 1, 63-bit
//! two's complement in the upper bits) or a pointer to an object (8-aligned,
//! low bit 0, never zero).
//!
//! Every object starts with one header word, followed by its payload:
//!
//! ```text
//!  63                        16 15      8  7   6   5   4   3  1   0
//! +----------------------------+---------+---+---+---+---+-----+---+
//! |  length (48 bits)          | expdepth| B | M | F | P | kind| 0 |
//! +----------------------------+---------+---+---+---+---+-----+---+
//! ```
//!
//! * bit 0 is clear in a header; a header with bit 0 set is a forwarding
//!   pointer (`new_address | 1`) left by the collector.
//! * `kind` (bits 1-3): see [`Kind`].
//! * `P` pinned, `F` frontier, `M` mark: `F` is set by the write barrier when
//!   a mutable object receives a pointer into another heap, so the read barrier
//!   checks only such objects. `P`, `M` and the exp-depth byte are reserved for
//!   entanglement management (pinning and the hybrid collector, part 2); this
//!   part never sets them, and the verifier checks they are clear. `B` (busy)
//!   marks a mutable raw array that `Scope::par_fill` has handed out in
//!   disjoint `&mut` pieces; every other access to it panics meanwhile.
//! * `length` counts fields for the value kinds and bytes for the raw kinds.

/// Bit 0 of a header: the word is a forwarding pointer.
pub(crate) const FORWARDED: u64 = 1;
const KIND_SHIFT: u32 = 1;
const KIND_MASK: u64 = 0b111 << KIND_SHIFT;
pub(crate) const PINNED: u64 = 1 << 4;
pub(crate) const FRONTIER: u64 = 1 << 5;
pub(crate) const MARK: u64 = 1 << 6;
pub(crate) const BUSY: u64 = 1 << 7;
pub(crate) const EXP_DEPTH_SHIFT: u32 = 8;
pub(crate) const EXP_DEPTH_MASK: u64 = 0xff << EXP_DEPTH_SHIFT;
const LEN_SHIFT: u32 = 16;
/// Largest length a header can record (fields or bytes).
pub const MAX_LEN: usize = (1 << 48) - 1;

/// What an object is. Immutable kinds are read without barriers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Immutable tuple or record of values.
    Tuple = 0,
    /// Mutable array of values.
    Array = 1,
    /// Mutable reference: one mutable value.
    Ref = 2,
    /// Immutable array of values (a frozen `Array`).
    Vector = 3,
    /// Mutable raw bytes (unboxed data).
    RawMut = 4,
    /// Immutable raw bytes (unboxed data; a frozen `RawMut`).
    Raw = 5,
}

impl Kind {
    pub(crate) fn from_bits(b: u64) -> Option<Kind> {
        Some(match b {
            0 => Kind::Tuple,
            1 => Kind::Array,
            2 => Kind::Ref,
            3 => Kind::Vector,
            4 => Kind::RawMut,
            5 => Kind::Raw,
            _ => return None,
        })
    }
    /// Does the payload hold values (which the collector traces)?
    pub fn holds_values(self) -> bool {
        matches!(self, Kind::Tuple | Kind::Array | Kind::Ref | Kind::Vector)
    }
    /// Can the payload change after allocation (so accesses need barriers)?
    pub fn is_mutable(self) -> bool {
        matches!(self, Kind::Array | Kind::Ref | Kind::RawMut)
    }
    /// The immutable kind this kind freezes into.
    pub(crate) fn frozen(self) -> Kind {
        match self {
            Kind::Array => Kind::Vector,
            Kind::RawMut => Kind::Raw,
            k => k,
        }
    }
}

#[inline]
pub(crate) const fn make_header(kind: Kind, len: usize) -> u64 {
    ((len as u64) << LEN_SHIFT) | ((kind as u64) << KIND_SHIFT)
}

#[inline]
pub(crate) fn header_kind(h: u64) -> Kind {
    // A header built by make_header always has a valid kind; the verifier
    // checks headers with `check_header` instead.
    match Kind::from_bits((h & KIND_MASK) >> KIND_SHIFT) {
        Some(k) => k,
        None => Kind::Raw,
    }
}

#[inline]
pub(crate) fn header_len(h: u64) -> usize {
    (h >> LEN_SHIFT) as usize
}

#[inline]
pub(crate) fn with_kind(h: u64, kind: Kind) -> u64 {
    (h & !KIND_MASK) | ((kind as u64) << KIND_SHIFT)
}

/// Payload words of an object of `kind` and `len`.
#[inline]
pub(crate) fn payload_words(kind: Kind, len: usize) -> usize {
    if kind.holds_values() {
        len
    } else {
        len.div_ceil(8)
    }
}

/// Total words of the object whose header is `h` (header included).
#[inline]
pub(crate) fn object_words(h: u64) -> usize {
    1 + payload_words(header_kind(h), header_len(h))
}

/// Check a header word for the verifier: a known kind, no reserved bits.
pub(crate) fn check_header(h: u64) -> Result<Kind, String> {
    if h & FORWARDED != 0 {
        return Err(format!("header {h:#x} is a forwarding pointer"));
    }
    let kind = Kind::from_bits((h & KIND_MASK) >> KIND_SHIFT)
        .ok_or_else(|| format!("header {h:#x} has an unknown kind"))?;
    if h & BUSY != 0 && kind != Kind::RawMut {
        return Err(format!("{kind:?} header {h:#x} has the busy bit, which only RawMut arrays take"));
    }
    if h & (PINNED | MARK | EXP_DEPTH_MASK) != 0 {
        return Err(format!("header {h:#x} has pin/mark/exp-depth bits set, which this part never sets"));
    }
    if h & FRONTIER != 0 && !kind.is_mutable() {
        return Err(format!("immutable {kind:?} header {h:#x} has the frontier bit"));
    }
    Ok(kind)
}

/// A raw 64-bit value: an unboxed integer or a pointer to an object.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub(crate) struct Word(pub(crate) u64);

/// Smallest integer a value can hold (63-bit).
pub const INT_MIN: i64 = i64::MIN >> 1;
/// Largest integer a value can hold (63-bit).
pub const INT_MAX: i64 = i64::MAX >> 1;

impl Word {
    #[inline]
    pub(crate) fn int(i: i64) -> Word {
        Word(((i as u64) << 1) | 1)
    }
    #[inline]
    pub(crate) fn is_int(self) -> bool {
        self.0 & 1 == 1
    }
    #[inline]
    pub(crate) fn as_int(self) -> i64 {
        (self.0 as i64) >> 1
    }
    #[inline]
    pub(crate) fn is_ptr(self) -> bool {
        self.0 & 1 == 0 && self.0 != 0
    }
}

impl std::fmt::Debug for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_int() {
            write!(f, "int {}", self.as_int())
        } else {
            write!(f, "ptr {:#x}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_round_trip_at_the_edges() {
        for i in [0, 1, -1, 42, INT_MIN, INT_MAX, INT_MAX - 1, INT_MIN + 1] {
            let w = Word::int(i);
            assert!(w.is_int() && !w.is_ptr());
            assert_eq!(w.as_int(), i);
        }
    }

    #[test]
    fn headers_encode_kind_and_length() {
        for kind in [Kind::Tuple, Kind::Array, Kind::Ref, Kind::Vector, Kind::RawMut, Kind::Raw] {
            for len in [0usize, 1, 7, 8, 9, 1000, MAX_LEN] {
                let h = make_header(kind, len);
                assert_eq!(h & FORWARDED, 0);
                assert_eq!(header_kind(h), kind);
                assert_eq!(header_len(h), len);
                assert_eq!(check_header(h).unwrap(), kind);
            }
        }
        assert_eq!(object_words(make_header(Kind::Raw, 9)), 3);
        assert_eq!(object_words(make_header(Kind::Tuple, 3)), 4);
        assert_eq!(header_kind(with_kind(make_header(Kind::Array, 5), Kind::Vector)), Kind::Vector);
        assert!(check_header(make_header(Kind::Tuple, 1) | FRONTIER).is_err());
        assert!(check_header(make_header(Kind::Array, 1) | PINNED).is_err());
        assert!(check_header(0x1000 | FORWARDED).is_err());
        assert!(check_header(7 << KIND_SHIFT).is_err());
    }
}
