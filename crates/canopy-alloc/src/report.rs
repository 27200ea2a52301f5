//! Messages about bad frees, written without allocating.
//!
//! Every message names the call, the pointer and what was wrong, e.g.
//! `canopy: free(0x7f12a0010040): double free of a 112-byte block (class 6, slab 0x7f12a0010000)`.
//! In check mode the process then aborts; in the default mode the free is
//! refused (the memory is left as it was) and the message is printed when
//! `CANOPY_VERBOSE=1`, or for the first few occurrences otherwise.

use core::sync::atomic::{AtomicUsize, Ordering};

/// What was wrong with a free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadFree {
    /// The block is already free.
    DoubleFree,
    /// The pointer is not inside memory Canopy manages.
    Foreign,
    /// The pointer is inside Canopy's memory but not at the start of a live block.
    NotABlock,
    /// The size or class given to a sized free does not match the block.
    WrongSize,
    /// The pointer is inside pages lent to another layer (a region allocator).
    Lent,
}

impl BadFree {
    fn text(self) -> &'static str {
        match self {
            BadFree::DoubleFree => "double free of a block",
            BadFree::Foreign => "pointer was not allocated by Canopy",
            BadFree::NotABlock => "pointer is not the start of a live block",
            BadFree::WrongSize => "size or class does not match the block",
            BadFree::Lent => "pointer is inside pages lent to a region allocator (free it through the region API)",
        }
    }
}

/// A fixed-size text buffer.
pub(crate) struct Buf {
    bytes: [u8; 256],
    len: usize,
}

impl Buf {
    pub(crate) const fn new() -> Buf {
        Buf { bytes: [0; 256], len: 0 }
    }
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
    pub(crate) fn bytes(&mut self, s: &[u8]) -> &mut Self {
        for &b in s {
            if self.len < self.bytes.len() {
                self.bytes[self.len] = b;
                self.len += 1;
            }
        }
        self
    }
    pub(crate) fn hex(&mut self, v: usize) -> &mut Self {
        self.str("0x").digits(v, 16)
    }
    pub(crate) fn dec(&mut self, v: usize) -> &mut Self {
        self.digits(v, 10)
    }
    fn digits(&mut self, v: usize, radix: usize) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut n = v;
        let mut i = 0;
        loop {
            let d = (n % radix) as u8;
            digits[i] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            i += 1;
            n /= radix;
            if n == 0 {
                break;
            }
        }
        while i > 0 {
            i -= 1;
            if self.len < self.bytes.len() {
                self.bytes[self.len] = digits[i];
                self.len += 1;
            }
        }
        self
    }
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

static REPORTED: AtomicUsize = AtomicUsize::new(0);
/// Messages printed in the default mode before going quiet (unless verbose).
const QUIET_AFTER: usize = 8;

/// Number of bad frees seen so far (refused in the default mode).
pub fn bad_frees() -> usize {
    REPORTED.load(Ordering::Relaxed)
}

/// Report a bad free.  `call` is the API function (`"free"`, `"realloc"`,
/// ...), `detail` optional extra words (block size, class, slab).
/// Aborts in check mode; returns in the default mode.
#[cold]
pub(crate) fn bad_free(call: &str, p: *const u8, what: BadFree, block_size: usize, class: Option<usize>) {
    let n = REPORTED.fetch_add(1, Ordering::Relaxed);
    let mut b = Buf::new();
    b.str("canopy: ").str(call).str("(").hex(p as usize).str("): ").str(what.text());
    if block_size != 0 {
        b.str(" (block of ").dec(block_size).str(" bytes");
        if let Some(c) = class {
            b.str(", class ").dec(c);
        }
        b.str(")");
    }
    finish(&mut b, n, consequence(call));
}

/// What the program gets in the default mode, for the message's tail.
fn consequence(call: &str) -> &'static str {
    match call {
        "malloc_usable_size" => "; the call was refused and returned 0\n",
        "realloc" => "; the call was refused and returned NULL, nothing freed\n",
        _ => "; the free was refused\n",
    }
}

/// End a report: abort in check mode; otherwise print it (the first few, or
/// all when verbose) with `outcome` appended.
fn finish(b: &mut Buf, n: usize, outcome: &str) {
    let opts = crate::options();
    if opts.check {
        b.str("; aborting (check mode)\n");
        canopy_sys::write_stderr(b.as_bytes());
        canopy_sys::abort();
    }
    if opts.verbose || n < QUIET_AFTER {
        b.str(outcome);
        canopy_sys::write_stderr(b.as_bytes());
    }
}

/// Report a kept list (see `Heap::keep`) found to run in a cycle at block
/// `p`, which only a block freed twice through `free_class_unchecked`
/// makes.  The rest of the list is left alone.
#[cold]
pub(crate) fn kept_list_broken(p: *const u8, class: usize) {
    let n = REPORTED.fetch_add(1, Ordering::Relaxed);
    let mut b = Buf::new();
    b.str("canopy: free_class_unchecked(").hex(p as usize).str("): the kept list of class ").dec(class).str(
        " runs in a cycle (back to a block it held, or past its room): a block was freed twice through the unchecked free",
    );
    finish(&mut b, n, "; the rest of that list is left alone (its blocks are not reused)\n");
}

/// Report a node of a heap's inbox of remote frees that is not a block in
/// flight to that heap: a double free raced with the remote free, or the
/// block was reused meanwhile, so the inbox from that node on is given up
/// (see `Heap::inbox_broken`).
#[cold]
/// `linked`: the block was queued by its own first word (a free from a
/// thread without a heap), so the inbox behind it cannot be trusted; else it
/// came in a batch, and only it is dropped.
pub(crate) fn bad_inbox_node(p: *const u8, linked: bool) {
    let n = REPORTED.fetch_add(1, Ordering::Relaxed);
    let mut b = Buf::new();
    b.str("canopy: free(").hex(p as usize).str("): a remote free reached the owning thread as something other than a block in flight to it (a double free racing with the remote free, or a block reused meanwhile)");
    if linked {
        finish(&mut b, n, "; the owner's inbox is given up and its memory kept
");
    } else {
        finish(&mut b, n, "; that free is dropped
");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numbers() {
        let mut b = Buf::new();
        b.str("x=").hex(0xdead_beef).str(" n=").dec(0).str(",").dec(1234567);
        assert_eq!(b.as_bytes(), b"x=0xdeadbeef n=0,1234567");
    }
}
