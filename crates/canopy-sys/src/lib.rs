//! The platform layer of Canopy: the only crate that asks the operating
//! system for memory.
//!
//! Glossary (used by every layer above):
//! - *reserve*: claim a range of virtual addresses.  Canopy reserves read/write
//!   with `MAP_NORESERVE`, so a page costs physical memory only once touched.
//! - *commit*: make a reserved range usable.  On Linux this is implicit on
//!   first touch; [`commit`] only hints the kernel.
//! - *decommit*: give the physical pages of a range back to the OS while
//!   keeping the addresses (`MADV_DONTNEED`); the range reads as zero after.
//! - *release*: give the addresses back (`munmap`).
//!
//! Nothing here allocates through the Rust or C heap: the allocator calls
//! these functions from inside `malloc`.
#![deny(missing_docs)]

use core::ptr;

/// Why an address-space operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsError {
    /// The operation that failed (`"mmap"`, `"madvise"`, ...).
    pub op: &'static str,
    /// `errno` after the call.
    pub errno: i32,
}

impl core::fmt::Display for OsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} failed with errno {}", self.op, self.errno)
    }
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

/// Set this thread's `errno` (the C API reports errors through it).
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value }
}

/// The OS page size in bytes.  Asked of the OS once: the allocator needs it
/// on every large allocation and free, where `sysconf` cost 7 % of the time
/// of a loop of 64..544 KiB blocks.
#[inline]
pub fn page_size() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    // Relaxed: every thread that reads 0 asks the OS and stores the same value.
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let n = if n <= 0 { 4096 } else { n as usize };
            PAGE.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Reserve `size` bytes of address space aligned to `align` (a power of two,
/// at least the page size).  The range is readable and writable and backed
/// lazily.  Returns the aligned base.
pub fn reserve_aligned(size: usize, align: usize) -> Result<*mut u8, OsError> {
    debug_assert!(align.is_power_of_two());
    let total = size.checked_add(align).ok_or(OsError { op: "reserve size", errno: libc::ENOMEM })?;
    // SAFETY: anonymous private mapping with no fixed address; the kernel
    // chooses the range, so no existing mapping is disturbed.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(OsError { op: "mmap", errno: errno() });
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = total - head - size;
    // SAFETY: [start, aligned) and [aligned+size, start+total) lie inside the
    // mapping just made and nobody else knows about them.
    unsafe {
        if head > 0 {
            libc::munmap(start as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((aligned + size) as *mut libc::c_void, tail);
        }
    }
    Ok(aligned as *mut u8)
}

/// Reserve `size` bytes at exactly `base` (for the global address space:
/// every process maps the same range at the same address).  Fails with
/// `EEXIST` if any part of the range is already mapped.
pub fn reserve_fixed(base: usize, size: usize) -> Result<*mut u8, OsError> {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the
    // kernel refuses instead.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(OsError { op: "mmap(MAP_FIXED_NOREPLACE)", errno: errno() });
    }
    if p as usize != base {
        // Old kernels ignore the flag and treat the address as a hint.
        // SAFETY: p..p+size is the mapping just made.
        unsafe { libc::munmap(p, size) };
        return Err(OsError { op: "mmap(MAP_FIXED_NOREPLACE)", errno: libc::EEXIST });
    }
    Ok(p as *mut u8)
}

/// The process's limit on address space (`RLIMIT_AS`, what `ulimit -v`
/// sets) in bytes, or `None` when there is none.  Every mapping counts
/// against it, reserved or touched: an allocator that reserves its address
/// space up front must reserve less, and grow, under such a limit.
pub fn address_space_limit() -> Option<usize> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(usize::try_from(r.rlim_cur).unwrap_or(usize::MAX))
}

/// Hint that `[p, p+len)` will be used soon.
///
/// # Safety
/// The range must lie inside a reservation made by this crate.
pub unsafe fn commit(p: *mut u8, len: usize) {
    // SAFETY: the caller guarantees the range is ours; WILLNEED is advisory.
    unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_WILLNEED) };
}

/// Give the physical pages of `[p, p+len)` back to the OS.  The addresses stay
/// reserved and read as zero afterwards.
///
/// # Safety
/// The range must be page aligned, inside a reservation made by this crate,
/// and hold no live data.
pub unsafe fn decommit(p: *mut u8, len: usize) -> Result<(), OsError> {
    // SAFETY: the caller guarantees the range is ours and dead.
    let r = unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if r != 0 {
        return Err(OsError { op: "madvise(MADV_DONTNEED)", errno: errno() });
    }
    Ok(())
}

/// Ask for transparent huge pages on `[p, p+len)` (advisory).
///
/// # Safety
/// The range must lie inside a reservation made by this crate.
pub unsafe fn advise_huge(p: *mut u8, len: usize) {
    // SAFETY: advisory call on our own range.
    unsafe { libc::madvise(p as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

/// Give `[p, p+len)` back entirely.
///
/// # Safety
/// The range must be a reservation (or part of one) made by this crate that
/// nobody uses any more.
pub unsafe fn release(p: *mut u8, len: usize) {
    // SAFETY: the caller guarantees the range is ours and unused.
    unsafe { libc::munmap(p as *mut libc::c_void, len) };
}

/// A number that identifies the calling thread while it lives, read with one
/// instruction on x86-64 Linux (the thread control block's self pointer).
/// Never zero.
#[inline(always)]
pub fn thread_id() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let id: usize;
        // SAFETY: on x86-64 Linux, %fs points at the thread control block whose
        // first word is its own address (the TLS ABI); reading it has no side
        // effects.
        unsafe {
            core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) id, options(nostack, readonly, preserves_flags, pure));
        }
        id
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        // SAFETY: pthread_self has no preconditions.
        (unsafe { libc::pthread_self() }) as usize
    }
}

/// Milliseconds on the kernel's coarse monotonic clock (a vDSO read, no
/// system call; it advances in steps of a few milliseconds).  Never goes back.
pub fn monotonic_coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass; it neither allocates
    // nor fails for a clock the kernel has (CLOCK_MONOTONIC_COARSE, Linux 2.6.32+).
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A C string constant kept in the section `.rodata.canopy_hot`, which
/// `libcanopy_malloc.so` places beside the code every process runs (see
/// `crates/canopy-malloc/hot-text.ld`).  The kernel maps a shared library's
/// pages in 64 KiB windows around the pages a process touches, and every
/// mapped page counts in the process's RSS; a plain `c"..."` literal goes
/// into the merged string section with every other string of the library
/// (panic messages, the unwinder's), so reading a few option names at start,
/// or handing a path to `open`, mapped a window of its own.  Evaluates to a
/// `&'static CStr`.
#[macro_export]
macro_rules! hot_cstr {
    ($s:literal) => {{
        const LEN: usize = $s.len() + 1;
        #[cfg_attr(target_os = "linux", link_section = ".rodata.canopy_hot")]
        static BYTES: [u8; LEN] = $crate::nul_terminated::<LEN>($s);
        $crate::hot_cstr_of(&BYTES)
    }};
}

/// `s` and a NUL, as an array of exactly `N` bytes, for [`hot_cstr!`].
/// Fails to compile (in a constant) when `s` holds a NUL or `N` is not its
/// length plus one.
pub const fn nul_terminated<const N: usize>(s: &str) -> [u8; N] {
    let b = s.as_bytes();
    assert!(b.len() + 1 == N, "N must be the length of the string plus one");
    let mut out = [0u8; N];
    let mut i = 0;
    while i < b.len() {
        assert!(b[i] != 0, "a C string constant cannot hold a NUL");
        out[i] = b[i];
        i += 1;
    }
    out
}

/// The C string of [`hot_cstr!`]'s bytes (made by [`nul_terminated`], so
/// one NUL, at the end).
#[inline]
pub fn hot_cstr_of(bytes: &'static [u8]) -> &'static core::ffi::CStr {
    match core::ffi::CStr::from_bytes_with_nul(bytes) {
        Ok(c) => c,
        Err(_) => unreachable!("hot_cstr bytes are NUL-terminated with no NUL inside"),
    }
}

/// Read an environment variable without allocating.  Returns the bytes of the
/// value (valid for the life of the process unless the environment is changed).
pub fn getenv(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv takes a NUL-terminated name and returns NULL or a
    // NUL-terminated string owned by the environment.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: p is a NUL-terminated C string from the environment.
    Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
}

extern "C" {
    /// The process's environment (POSIX), a null-terminated array of
    /// `NAME=value` strings.
    static environ: *const *const libc::c_char;
}

/// Call `f` with each `NAME=value` entry of the environment (the bytes,
/// without the NUL), without allocating.
pub fn for_each_env(mut f: impl FnMut(&[u8])) {
    // SAFETY: `environ` is the C library's environment array: null or a
    // null-terminated array of NUL-terminated strings, which is what is
    // read here (as `getenv` does; a concurrent `setenv` is the caller's
    // race, as with `getenv`).
    unsafe {
        let mut e = environ;
        if e.is_null() {
            return;
        }
        while !(*e).is_null() {
            f(core::ffi::CStr::from_ptr(*e).to_bytes());
            e = e.add(1);
        }
    }
}

/// Write bytes to standard error with `write(2)`, without allocating.
pub fn write_stderr(bytes: &[u8]) {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: rest points at rest.len() readable bytes.
        let n = unsafe { libc::write(2, rest.as_ptr() as *const libc::c_void, rest.len()) };
        if n <= 0 {
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// Abort the process (no unwinding, no allocation).
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Give up the processor (used by spin loops that wait long).
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Register this process for [`barrier_all_threads`].  Returns false where
/// the kernel does not offer it.
pub fn register_process_barrier() -> bool {
    // SAFETY: membarrier takes plain integer arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// Make every running thread of this process execute a full memory barrier
/// before returning (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`), so a
/// thread's fast path can pair with it using only a compiler fence.
/// Needs [`register_process_barrier`] first.
pub fn barrier_all_threads() {
    // SAFETY: membarrier takes plain integer arguments.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
}

/// Number of processors online.
pub fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n <= 0 {
        1
    } else {
        n as usize
    }
}

/// Number of threads in this process (field 20 of `/proc/self/stat`), or
/// `None` where `/proc` cannot be read.  Allocates nothing and leaves
/// `errno` as it was (the allocator calls it inside a successful `malloc`).
pub fn thread_count() -> Option<usize> {
    let saved = errno();
    let n = read_thread_count();
    set_errno(saved);
    n
}

fn read_thread_count() -> Option<usize> {
    let mut buf = [0u8; 1024];
    let mut len = 0usize;
    // SAFETY: the path is NUL-terminated; each read writes inside buf.
    unsafe {
        let fd = libc::open(hot_cstr!("/proc/self/stat").as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        while len < buf.len() {
            let n = libc::read(fd, buf.as_mut_ptr().add(len) as *mut libc::c_void, buf.len() - len);
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        libc::close(fd);
    }
    parse_stat_threads(&buf[..len])
}

/// `num_threads` from the text of `/proc/PID/stat`.  The command name (field
/// 2, in parentheses) may hold spaces and parentheses itself, so fields are
/// counted from the last `)`: field 3 is the first after it, `num_threads`
/// (field 20) the eighteenth.
fn parse_stat_threads(text: &[u8]) -> Option<usize> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let field = text[close + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(17)?;
    let mut v = 0usize;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as usize)?;
    }
    (v > 0).then_some(v)
}

/// Resident set size of this process in bytes (from /proc/self/statm), or
/// `None` where unavailable.  Allocates nothing.
pub fn resident_bytes() -> Option<usize> {
    let mut buf = [0u8; 128];
    // SAFETY: the path is NUL-terminated; buf is writable for its length.
    let n = unsafe {
        let fd = libc::open(c"/proc/self/statm".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return None;
    }
    let text = &buf[..n as usize];
    let mut fields = text.split(|&b| b == b' ');
    fields.next()?;
    let rss = fields.next()?;
    let mut v = 0usize;
    for &b in rss {
        if !b.is_ascii_digit() {
            break;
        }
        v = v * 10 + (b - b'0') as usize;
    }
    Some(v * page_size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_cstr_is_the_literal_with_one_nul() {
        let c = hot_cstr!("CANOPY_SYS_HOT");
        assert_eq!(c.to_bytes_with_nul(), b"CANOPY_SYS_HOT\0");
        assert_eq!(hot_cstr!("").to_bytes_with_nul(), b"\0");
        assert_eq!(nul_terminated::<4>("abc"), *b"abc\0");
    }

    #[test]
    #[should_panic(expected = "cannot hold a NUL")]
    fn a_nul_inside_a_hot_cstr_is_refused() {
        let _ = nul_terminated::<4>("a\0b");
    }

    #[test]
    fn reserve_is_aligned_and_writable() {
        let p = reserve_aligned(4 << 20, 1 << 20).unwrap();
        assert_eq!(p as usize % (1 << 20), 0);
        // SAFETY: p..p+4MiB was just reserved read/write.
        unsafe {
            p.write(7);
            p.add((4 << 20) - 1).write(9);
            assert_eq!(p.read(), 7);
            decommit(p, 4 << 20).unwrap();
            assert_eq!(p.read(), 0, "decommitted memory reads as zero");
            release(p, 4 << 20);
        }
    }

    #[test]
    fn address_space_limit_reads_what_ulimit_sets() {
        // In a child, so the test process keeps its own limit.  The child
        // only makes system calls before _exit.
        // SAFETY: fork; the child calls async-signal-safe functions only.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let want: usize = 3 << 30;
            let r = libc::rlimit { rlim_cur: want as libc::rlim_t, rlim_max: libc::RLIM_INFINITY };
            // SAFETY: r is a valid rlimit.
            let set = unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) } == 0;
            let code = if !set {
                2
            } else if address_space_limit() == Some(want) {
                0
            } else {
                1
            };
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: pid is our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0, "the child read another limit (2: setrlimit failed)");
    }

    #[test]
    fn fixed_reservation_refuses_overlap() {
        let p = reserve_aligned(2 << 20, 1 << 20).unwrap();
        let e = reserve_fixed(p as usize, 1 << 20).unwrap_err();
        assert_eq!(e.errno, libc::EEXIST);
        // SAFETY: p is our reservation.
        unsafe { release(p, 2 << 20) };
        // Released, the range can be reserved at its address again.  Other
        // tests of this process map memory concurrently and may take the
        // range between the release and the reservation (EEXIST): then try
        // again at a fresh range; a few attempts always find one untouched.
        let mut at = p;
        for attempt in 0.. {
            match reserve_fixed(at as usize, 1 << 20) {
                Ok(q) => {
                    assert_eq!(q, at);
                    // SAFETY: q is our reservation.
                    unsafe { release(q, 1 << 20) };
                    break;
                }
                Err(e) if e.errno == libc::EEXIST && attempt < 20 => {
                    let r = reserve_aligned(2 << 20, 1 << 20).unwrap();
                    // SAFETY: r is our reservation.
                    unsafe { release(r, 2 << 20) };
                    at = r;
                }
                Err(e) => panic!("reserving a released range failed: {e:?}"),
            }
        }
    }

    #[test]
    fn thread_ids_differ_between_threads() {
        let me = thread_id();
        assert_ne!(me, 0);
        assert_eq!(me, thread_id());
        let other = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(me, other);
    }

    #[test]
    fn getenv_reads_without_allocating() {
        std::env::set_var("CANOPY_SYS_TEST_VAR", "42");
        assert_eq!(getenv(c"CANOPY_SYS_TEST_VAR"), Some(&b"42"[..]));
        assert_eq!(getenv(c"CANOPY_SYS_TEST_VAR_MISSING"), None);
        // The same variable, found by walking the environment (in this test:
        // the only one of the crate that changes the environment).
        let mut seen = 0;
        for_each_env(|e| seen += usize::from(e == b"CANOPY_SYS_TEST_VAR=42"));
        assert_eq!(seen, 1);
    }

    #[test]
    fn thread_count_follows_threads() {
        let before = thread_count().unwrap();
        assert!(before >= 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            ready_tx.send(()).unwrap();
            rx.recv().unwrap();
        });
        ready_rx.recv().unwrap();
        // Other tests' threads come and go; this one is there for sure.
        assert!(thread_count().unwrap() >= 2);
        tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn stat_threads_are_parsed_after_the_last_parenthesis() {
        let line = b"4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 7 0 123 456 78 18446744073709551615\n";
        assert_eq!(parse_stat_threads(line), Some(7));
        let plain = b"1 (sh) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 1 2 3";
        assert_eq!(parse_stat_threads(plain), Some(1));
        assert_eq!(parse_stat_threads(b"1 (sh) S 0 1"), None);
        assert_eq!(parse_stat_threads(b"no parenthesis here"), None);
        assert_eq!(parse_stat_threads(b"1 (x) S 0 1 1 0 -1 4 1 0 0 0 0 0 0 0 20 0 x7 0"), None);
    }

    #[test]
    fn resident_bytes_is_reported() {
        assert!(resident_bytes().unwrap() > 0);
    }
}
