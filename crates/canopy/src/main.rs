//! `canopy`: Canopy's command-line tool.  It runs the papers' experiments
//! against the anchor allocators (`canopy tour`, `canopy bench ...`), manages
//! the anchors (`canopy anchors`) and shows the allocator's statistics
//! (`canopy stats`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use canopy_bench::anchors::{self, Contenders, Discover, ANCHORS};
use canopy_bench::artifacts::Lookup;
use canopy_bench::experiments::region::RegionCommon;
use canopy_bench::experiments::{
    hh_suite, in_process, rc, region_frag, region_pack, region_speed, sac, sac_callgrind, workloads, Common,
    Finished,
};
use canopy_bench::report::{self, Size};
use clap::{Args, Parser, Subcommand};

const LONG_ABOUT: &str = "\
Canopy is a memory-management runtime for parallel programs. This tool runs the experiments of the \
papers Canopy implements, side by side against anchor allocators, and writes the results as JSON, \
Markdown tables and SVG charts.

Contenders: glibc's malloc (nothing preloaded), Canopy (LD_PRELOAD=libcanopy_malloc.so, built on \
demand) and the anchors jemalloc, mimalloc and tcmalloc (Debian packages libjemalloc2, \
libmimalloc2.0, libtcmalloc-minimal4; installed with apt-get when missing and running as root).

Experiments:
  sac            The with-loop microbenchmark of Grelck & Scholz, \"Efficient Heap Management for \
Declarative Data Parallel Programming on Multicores\" (the SAC private heap manager; paper 000, \
Fig. 1): every element of a vector of N/X elements allocates, fills, sums and frees a temporary \
vector of X ints, 50 times over, for X = 1000, 250, 100, 25 (same arithmetic, 40x more \
allocations at X = 25). Reported like the paper's Figs. 5 and 6: time relative to the system \
allocator (glibc here), speedup over it on one thread, plus time relative to a compute-only bound \
and the share of time spent in the allocator. Also runs Canopy's rich interface (size class \
computed once) and the same kernel in Rust.
  sac-callgrind  The same kernel, single-threaded, under valgrind's callgrind: instructions per \
malloc+free pair for each allocator, a repeatable number where times on a shared machine are not.
  workloads      General allocation patterns: a Larson server simulation (remote frees), \
producer/consumer, cache-scratch and cache-thrash false sharing (as in the Hoard paper), a random \
size walk from 8 B to 4 MiB (peak RSS), thread churn, mixed sizes (one thread's small blocks \
while others allocate and free large ones) and phases (large blocks after a phase that freed \
64 MiB per thread, medium ones beside a heap whose free blocks cannot merge). Time and peak RSS relative to the best anchor and to mimalloc, with \
geometric means.
  in-process     The allocators loaded side by side into one process (dlopen) and run in \
alternating bursts, the order turned every burst: one 64-byte block freed and allocated again, four \
live blocks of one size and of random sizes 16..256, a producer thread whose blocks a consumer \
frees, the SAC kernel at X = 25 on one and two threads against its compute-only bound, and Larson's two threads with each thread's work timed between the barriers. On a shared machine a slow minute then falls on every allocator \
alike; ns per operation and ratios to the best anchor.

Region experiments (paper 002, Lyberis et al., \"The Myrmics Memory Allocator: Hierarchical, \
Message-Passing Allocation for Global Address Spaces\"), run in-process on Canopy's region allocator:
  region-frag    Fig. 4a-c: random allocate/free in one region (192 B at 60/40, then phases of \
varying probability, then six sizes); requested bytes against full and partial slabs over time, \
checked against an independent model of the slabs; targets: partial slabs stay a small constant, \
holes are filled before new slabs are taken.
  region-speed   ns per allocation and per free in a region, and the time to free a region of \
10^3..10^7 objects, side by side with glibc malloc, Canopy's allocator, bumpalo, typed-arena and \
slab; targets: region allocation at least as fast as Canopy's malloc, region free of 10^6 objects \
at least 100x faster than freeing them one by one.
  region-pack    runs and cost of packing a 30,000-node list and a Barnes-Hut oct-tree with one \
region per level (§4.3, §6.3); target: the list packs into a handful of runs.

Parallel benchmark suite (paper 004, Arora et al., \"Efficient Parallel Functional Programming with \
Effects\", §5):
  hh-suite       primes, msort-int64, tokens, mcss, linefit, sparse-mxv, wc, fib and nqueens: the \
sequential Rust baseline against rayon on the system allocator and against canopy-hh (MPL's \
hierarchical heaps) at 1, 2, ... threads, each run in its own child process; T_1/T_s, T_2/T_s, \
speedup, time against rayon, peak RSS against the baseline and GC counters, like the paper's Fig. 6.

Experiments of the other papers (the Microgrid delegated reference counting, the GUM virtual shared \
heap) will join as their layers land.

Sizes: --quick runs in seconds (CI smoke runs, the tour); the default is in between; --paper uses \
the paper's problem size. Every configuration runs several times with the contenders interleaved, \
and the median is reported. A missing anchor is skipped with a warning; a crash or a checksum that \
differs between allocators is an error naming the allocator, the program and its arguments, and is \
recorded in the results.";

#[derive(Debug, Parser)]
#[command(name = "canopy", version, about = "Canopy's command-line tool: run the papers' allocator experiments against anchor allocators.", long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,

    /// Where results go [default: results/ at the workspace root when run inside the Canopy repository, else ./results; the tour uses its tour/ subfolder]
    #[arg(long, global = true, value_name = "DIR")]
    results_dir: Option<PathBuf>,

    /// Never run apt-get to install a missing anchor (just skip it)
    #[arg(long, global = true)]
    no_install: bool,

    /// Kill a benchmark program that runs longer than this many seconds
    #[arg(long, global = true, default_value_t = 900, value_name = "SECONDS")]
    timeout: u64,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run every experiment at the quick size against the anchors, print the tables, write results/tour/
    #[command(
        long_about = "Run every experiment that exists (sac, sac-callgrind, workloads, in-process, region-frag, region-speed, \
                            region-pack, rc-sac, rc-kernel, rc-fft, rc-reuse, hh-suite) at the quick size against the anchors, \
                            print their Markdown tables and write them to results/tour/ (or --results-dir), next to, not over, \
                            the full-size results in results/ that the README cites. Takes a few minutes; it builds \
                            libcanopy_malloc.so and the Rust SAC binaries first if they are missing."
    )]
    Tour(TourArgs),
    /// Run one experiment
    Bench {
        #[command(subcommand)]
        experiment: Experiment,
    },
    /// Show which anchor allocators are installed (--install installs the missing ones)
    Anchors {
        /// Install missing anchors with apt-get (needs root)
        #[arg(long)]
        install: bool,
    },
    /// Run a small allocation workload on Canopy and print the allocator's statistics
    Stats(StatsArgs),
}

#[derive(Debug, Subcommand)]
enum Experiment {
    /// SAC with-loop microbenchmark, X sweep (paper 000, Grelck & Scholz, Figs. 1, 5, 6)
    #[command(
        long_about = "The with-loop microbenchmark of the SAC private heap manager paper (Grelck & Scholz, \
                            paper 000, Fig. 1): A = N/X elements; each element allocates a temporary of X ints, \
                            fills and sums it, frees it; 50 iterations at paper size. Rows: each allocator with \
                            malloc/free, Canopy's rich interface (canopy-rich), the compute-only bound, and the \
                            Rust kernel (rs-*). Tables: time relative to glibc (Fig. 5), median time, share of \
                            time in the allocator ((t - t_bound) / t), ns per pair, and speedup over glibc on one \
                            thread (Fig. 6)."
    )]
    Sac(SacArgs),
    /// Instructions per malloc+free pair in the SAC kernel, counted by callgrind (paper 000)
    #[command(
        long_about = "The SAC kernel on one thread under valgrind's callgrind. For each allocator: \
                            (Ir(malloc mode) - Ir(bound mode)) / pairs, the instructions one malloc+free pair \
                            costs; also Canopy's rich interface and the Rust kernel. Counts are repeatable, so \
                            each variant runs once. Needs valgrind (skipped with a message otherwise)."
    )]
    SacCallgrind(CallgrindArgs),
    /// General workloads: Larson, producer/consumer, false sharing, size walk, thread churn, mixed sizes, phases
    #[command(
        long_about = "General allocation workloads (c/workloads.c): larson (server simulation, tables handed \
                            between threads so frees are remote), prodcons (one thread allocates, another frees), \
                            cache-scratch and cache-thrash (allocator-induced false sharing, after the Hoard \
                            benchmarks), sizewalk (one thread, sizes log-uniform 8 B..4 MiB, realloc, peak RSS), \
                            churn (thousands of short-lived threads), mixed (one thread allocates and frees \
                            small blocks while the others allocate and free 64..544 KiB ones), phases (each \
                            thread builds and frees 64 MiB of 1 MiB blocks, then allocates and frees \
                            256..544 KiB blocks: large requests cut from a long run of free memory; then \
                            8..208 KiB blocks beside a heap of 9..45 KB blocks with every other one freed). \
                            Time and peak RSS relative to the best anchor and to mimalloc, with geometric means."
    )]
    Workloads(WorkloadArgs),
    /// The allocators side by side in one process, alternating bursts: small-block loops and Larson
    #[command(
        long_about = "Every allocator loaded into one process with dlopen (each called through its own malloc \
                            and free; jemalloc gets static TLS room through GLIBC_TUNABLES), then each loop run \
                            in short bursts on each allocator in turn, the order turned by one every burst, timing \
                            only the loop's own work. Loops: same (one 64-byte block freed and allocated again), \
                            four (four live 64-byte blocks, one replaced at random each step), random (the same \
                            with sizes 16..256: the small half of the mixed workload), prodcons (one thread \
                            allocates 16..4096 B blocks, the other frees them, through a bounded queue; \
                            the burst timed whole), sac and sac2 (the SAC kernel at X = 25 on one and \
                            two threads, also on the compute-only bound: a malloc that hands each thread \
                            its one temporary, and on Canopy's unchecked rich interface, the canopy-unchecked \
                            column; the same kernel in Rust, sac_rs_inprocess, compares std's System, Canopy and \
                            CanopyUnchecked as global allocators and the rich interface against the Rust bound, \
                            in a table of its own), larson (two threads, tables \
                            of 1000 blocks of 16..1024 B, each round on the other thread's table; each thread's \
                            work timed between the barriers). Nanoseconds per free+malloc: the median burst, then \
                            the median over processes; ratios to the best anchor and to mimalloc. Separate \
                            processes on a shared VM measure the minute they ran in as much as the allocator \
                            (Larson's barrier wake-ups above all); most ratios here repeat to within a few per cent from run to run."
    )]
    InProcess(InProcessArgs),
    /// Fragmentation in one region: requested bytes vs. full and partial slabs (paper 002, Fig. 4a-c)
    #[command(
        long_about = "The fragmentation runs of paper 002 (Myrmics), §6.2 and Fig. 4a-c, on Canopy's region \
                            allocator: a serial program in one region, at each step allocating an object with \
                            probability p or freeing a random live one. (a) 192 B objects, p = 0.6; (b) 192 B, \
                            alternating allocation-heavy and free-heavy phases; (c) the phases of b with six sizes \
                            (64, 1024, 4096, 192, 1536, 50048 B). Plots requested bytes (left axis) against full and \
                            partial slabs (right axis) over time, like the paper. Checks the allocator's slab counters \
                            against the program's own model of every slab, and two targets: partial slabs stay a \
                            small constant while the region grows (part a: mean <= 8, no growth from the first to \
                            the last quarter), and holes are filled before new slabs are taken (no allocation lands \
                            in an unused slab while a slab of its slot size has a free slot). Seeded, deterministic."
    )]
    RegionFrag(RegionFragArgs),
    /// Allocate/free in a region and free a whole region, vs. malloc, bumpalo, typed-arena, slab (paper 002)
    #[command(
        long_about = "Throughput of allocation and free in a region of Canopy's region allocator, and the time to \
                            free a whole region of 10^3..10^7 objects (paper 002, Myrmics, §4.3: freeing a region costs \
                            time in its slabs, not its objects), side by side with glibc's malloc \
                            (checked not to be preloaded), Canopy's allocator called directly, bumpalo (reset), \
                            typed-arena (drop) and slab (remove / drop). Sizes 16, 64, 192 B and mixed 16-256 B; the \
                            free-everything sweep uses 64 B. Every repetition of every contender is a child process of \
                            this binary (a warm-up round, then the measured rounds), the contenders interleaved; medians. \
                            Separate processes, because a contender's speed depends on where its memory lands: in one \
                            process that is fixed for all its rounds and shifted by what the other contenders did (the \
                            same 64 B path measured 10 and 15.5 ns in two region allocators of one process). \
                            Instructions per allocation are counted too, repeatably: callgrind on the timed loops of \
                            children with two and with one measured round (a tenth of the objects). \
                            Targets: region allocation at least as fast as Canopy's malloc for every size; region \
                            free of 10^6 objects at least 100x faster than freeing them one by one."
    )]
    RegionSpeed(RegionSpeedArgs),
    /// Packing regions into runs: a 30,000-node list and a per-level-region oct-tree (paper 002)
    #[command(
        long_about = "Region packing of paper 002 (Myrmics), §4.3, with the Barnes-Hut layout of §6.3: the runs \
                            (address, length) of a packed 30,000-node list in a fresh region (also with holes, and \
                            built in turn with another region), and of an oct-tree of random bodies with one region \
                            per tree level, nested (level k a child of level k-1). Reports runs, bytes, the time of \
                            pack_runs, pack and encode, against one run per object found by walking the structure. \
                            Target: the list packs into at most a handful (5) of runs."
    )]
    RegionPack(RegionPackArgs),
    /// canopy-rc: the SAC microbenchmark on reference-counted arrays, A updated in place (paper 000, Fig. 1)
    #[command(
        long_about = "The with-loop microbenchmark of paper 000 (Fig. 1) written with canopy-rc: A = modarray(A) \
                            updated in place each iteration, temporaries Array<i32, Local> (descriptor and data in one \
                            Canopy block). Reports time against the same program on Vec + glibc and on Arc<[T]> + \
                            glibc, and the allocations of A after the first iteration (0 when reuse works). In process."
    )]
    RcSac(RcSacArgs),
    /// canopy-rc: the synthetic reference-counting kernel per policy and thread count (paper 003, Figs. 5-8)
    #[command(
        long_about = "The synthetic kernel of paper 003 (Fig. 5): a with-loop over 512 and 4096 elements, two \
                            count operations on the shared input per element and W = 100 or 1000 units of work, for \
                            no counting, atomic, biased and delegated counting at 1.. CPUs mutator threads; speedup \
                            against one thread without counting (Fig. 8), pending count operations over time \
                            (Figs. 6-7), and the cost of a clone+drop pair and of a getrc round trip per policy."
    )]
    RcKernel(RcArgs),
    /// canopy-rc: 2-D FFT 128x128 (Danielson-Lanczos) with and without reuse, against plain Rust (paper 003 §5.2)
    RcFft(RcArgs),
    /// canopy-rc: reuse accuracy of delegated counting after k concurrent tasks (false shared / false unique)
    RcReuse(RcArgs),
    /// Parallel suite of paper 004 §5: sequential baseline, rayon and canopy-hh
    #[command(
        long_about = "The parallel benchmark suite of paper 004 (Arora, Westrick, Acar, \"Efficient Parallel \
                            Functional Programming with Effects\"), §5 \"Evaluation\": the programs of its \
                            cross-language comparison (§5.5, Figs. 9 and 10) - primes (sieve up to 10^8 at paper size), \
                            msort-int64 (2*10^7 hashed int64), tokens, mcss, linefit, sparse-mxv (10^8 nonzeros), wc - \
                            plus fib and nqueens for fine-grained forking. Each program has a sequential Rust baseline \
                            (one thread, no runtime: the analogue of the paper's MLton column) and a rayon version on the \
                            system allocator, and a canopy-hh version (hierarchical heaps: a managed heap per task, the analogue of the \
                            paper's MPL column) whose children also report the collector's counters. Inputs are generated \
                            deterministically from --seed. Every run is a child \
                            process of this binary (peak RSS = its VmHWM); configurations run interleaved, medians are \
                            reported. Every rayon and canopy-hh answer must equal the sequential one, or the run fails \
                            naming the program, variant and input. Reported like the paper's Fig. 6: T_p/T_s, the speedup \
                            T_1/T_2, R_p/R_s and their geomeans (paper: MPL* T_1/T_s geomean 1.34), canopy-hh's time against \
                            rayon at the same thread count, and issue 5's targets for canopy-hh."
    )]
    HhSuite(HhSuiteArgs),
    /// One measured run of one hh-suite program (used by `bench hh-suite`)
    #[command(hide = true)]
    HhSuiteChild(HhSuiteChildArgs),
    /// Measured rounds of one region-speed contender (used by `bench region-speed`)
    #[command(hide = true)]
    RegionSpeedChild(RegionSpeedChildArgs),
}

#[derive(Debug, Args)]
struct RegionSpeedChildArgs {
    #[arg(long)]
    contender: String,
    #[arg(long)]
    config: usize,
    #[arg(long)]
    n: usize,
    #[arg(long)]
    max_n: usize,
    #[arg(long)]
    seed: u64,
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

#[derive(Debug, Args)]
struct RcArgs {
    #[command(flatten)]
    size: SizeArgs,
    /// Runs per configuration; the median is reported [default: 3 quick, 5 otherwise]
    #[arg(long)]
    runs: Option<usize>,
}

#[derive(Debug, Args)]
struct RcSacArgs {
    #[command(flatten)]
    rc: RcArgs,
    /// Temporary lengths X, comma-separated
    #[arg(
        long = "x",
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "1000,250,100,25"
    )]
    xs: Vec<usize>,
}

fn rc_common(cli: &Cli, a: &RcArgs) -> rc::RcCommon {
    rc::RcCommon {
        size: a.size.size(),
        runs: a.runs,
        results_dir: results_dir(cli),
    }
}

#[derive(Debug, Args)]
struct HhSuiteArgs {
    #[command(flatten)]
    size: SizeArgs,
    /// Thread counts of the rayon and canopy-hh runs, comma-separated [default: 1, 2, 4, ... up to the number of CPUs]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    threads: Option<Vec<usize>>,
    /// Programs to run, comma-separated [default: primes,msort-int64,tokens,mcss,linefit,sparse-mxv,wc,fib,nqueens]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    programs: Option<Vec<String>>,
    /// Runs per configuration; the median is reported [default: 3 quick, 5 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Untimed runs before the timed one in each child
    #[arg(long, default_value_t = 1)]
    warmups: usize,
    /// Seed of the generated inputs
    #[arg(long, default_value_t = 2023)]
    seed: u64,
}

#[derive(Debug, Args)]
struct HhSuiteChildArgs {
    #[arg(long)]
    program: String,
    #[arg(long)]
    variant: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long)]
    n: u64,
    #[arg(long, default_value_t = 0)]
    grain: u64,
    #[arg(long, default_value_t = 2023)]
    seed: u64,
    #[arg(long, default_value_t = 1)]
    warmups: usize,
}

#[derive(Debug, Args, Clone)]
struct SizeArgs {
    /// Quick size: seconds (CI smoke runs, the tour)
    #[arg(long, conflicts_with = "paper")]
    quick: bool,
    /// The paper's problem size (minutes)
    #[arg(long)]
    paper: bool,
}

impl SizeArgs {
    fn size(&self) -> Size {
        if self.quick {
            Size::Quick
        } else if self.paper {
            Size::Paper
        } else {
            Size::Default
        }
    }
}

#[derive(Debug, Args, Clone)]
struct ContenderArgs {
    /// Allocators to run, comma-separated [default: glibc,canopy,jemalloc,mimalloc,tcmalloc]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    contenders: Option<Vec<String>>,
}

#[derive(Debug, Args)]
struct SacArgs {
    #[command(flatten)]
    size: SizeArgs,
    #[command(flatten)]
    contenders: ContenderArgs,
    /// Thread counts, comma-separated [default: 1, 2, 4, ... up to the number of CPUs]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    threads: Option<Vec<usize>>,
    /// Runs per configuration; the median is reported [default: 3 quick, 5 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Temporary lengths X, comma-separated
    #[arg(
        long = "x",
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "1000,250,100,25"
    )]
    xs: Vec<usize>,
    /// Override N (paper: 10000000)
    #[arg(long)]
    n: Option<usize>,
    /// Override the number of iterations (paper: 50)
    #[arg(long)]
    iters: Option<usize>,
    /// Leave out the Rust kernel (sac_rs, sac_rs_canopy)
    #[arg(long)]
    no_rust: bool,
}

#[derive(Debug, Args)]
struct CallgrindArgs {
    #[command(flatten)]
    size: SizeArgs,
    #[command(flatten)]
    contenders: ContenderArgs,
    /// Temporary lengths X, comma-separated
    #[arg(
        long = "x",
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "1000,250,100,25"
    )]
    xs: Vec<usize>,
    /// malloc+free pairs per run [default: 10000 quick, 50000 default, 200000 paper]
    #[arg(long)]
    pairs: Option<usize>,
    /// Parallel valgrind runs (counts do not depend on it) [default: number of CPUs]
    #[arg(long)]
    jobs: Option<usize>,
    /// Leave out the Rust kernel
    #[arg(long)]
    no_rust: bool,
}

#[derive(Debug, Args)]
struct WorkloadArgs {
    #[command(flatten)]
    size: SizeArgs,
    #[command(flatten)]
    contenders: ContenderArgs,
    /// Threads for the multi-threaded workloads [default: number of CPUs, at least 2]
    #[arg(long)]
    threads: Option<usize>,
    /// Runs per workload; the median is reported [default: 3 quick, 11 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Workloads to run, comma-separated [default: all]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Option<Vec<String>>,
    /// Override the scale factor (work per workload; quick 1, default 8, paper 32)
    #[arg(long)]
    scale: Option<usize>,
}

#[derive(Debug, Args)]
struct InProcessArgs {
    #[command(flatten)]
    size: SizeArgs,
    #[command(flatten)]
    contenders: ContenderArgs,
    /// Processes per loop; the median is reported [default: 1 quick, 5 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Bursts per allocator in each process [default: 5 quick, 21 default, 41 paper]
    #[arg(long)]
    bursts: Option<usize>,
    /// Loops to run, comma-separated [default: all]
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    only: Option<Vec<String>>,
    /// Work per burst: 250 000 steps (prodcons: 50 000 blocks; sac: 100 000 elements; larson: 5 rounds) per unit [default: quick 1, default 2, paper 4]
    #[arg(long)]
    scale: Option<usize>,
    /// Leave out the SAC loops' Rust program (sac_rs_inprocess: System, Canopy, CanopyUnchecked and the rich interface side by side)
    #[arg(long)]
    no_rust: bool,
}

#[derive(Debug, Args)]
struct RegionFragArgs {
    #[command(flatten)]
    size: SizeArgs,
    /// Steps (allocate-or-free operations) per part [default: 20000 quick, 200000 default, 1000000 paper]
    #[arg(long)]
    steps: Option<usize>,
    /// Seed of the random choices
    #[arg(long, default_value_t = 2013)]
    seed: u64,
    /// Parts to run, comma-separated (a, b, c)
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "a,b,c"
    )]
    parts: Vec<String>,
}

#[derive(Debug, Args)]
struct RegionSpeedArgs {
    #[command(flatten)]
    size: SizeArgs,
    /// Child processes per contender and configuration (more rounds each for small counts); the median is reported [default: 3 quick, 9 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Objects per size in the throughput tables [default: 100000 quick, 1000000 otherwise]
    #[arg(long)]
    n: Option<usize>,
    /// Largest object count of the free-everything sweep [default: 1000000, 10000000 paper]
    #[arg(long)]
    max_n: Option<usize>,
    /// Skip the instruction counts (callgrind, a tenth of the objects)
    #[arg(long)]
    no_instructions: bool,
}

#[derive(Debug, Args)]
struct RegionPackArgs {
    #[command(flatten)]
    size: SizeArgs,
    /// Runs per measurement; the median is reported [default: 3 quick, 5 otherwise]
    #[arg(long)]
    runs: Option<usize>,
    /// Bodies in the oct-tree [default: 10000 quick, 100000 default, 1100000 paper]
    #[arg(long)]
    bodies: Option<usize>,
    /// Seed of the body positions
    #[arg(long, default_value_t = 2013)]
    seed: u64,
}

#[derive(Debug, Args)]
struct TourArgs {
    #[command(flatten)]
    contenders: ContenderArgs,
    /// Runs per configuration [default: 3]
    #[arg(long)]
    runs: Option<usize>,
    /// Leave out the Rust kernel
    #[arg(long)]
    no_rust: bool,
}

#[derive(Debug, Args)]
struct StatsArgs {
    /// Threads allocating
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Allocations per thread
    #[arg(long, default_value_t = 200_000)]
    ops: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn results_dir(cli: &Cli) -> PathBuf {
    cli.results_dir
        .clone()
        .unwrap_or_else(report::default_results_dir)
}

fn common(cli: &Cli, size: Size, runs: Option<usize>, c: &ContenderArgs) -> Result<Common> {
    let mut d = Discover {
        install: !cli.no_install,
        canopy_lookup: Lookup::FindOrBuild,
        ..Discover::default()
    };
    if let Some(list) = &c.contenders {
        d.wanted = list.clone();
    }
    let contenders = Contenders::discover(&d)?;
    contenders.warn_skipped();
    anyhow::ensure!(!contenders.list.is_empty(), "no contender is available");
    Ok(Common {
        size,
        runs,
        results_dir: results_dir(cli),
        contenders,
        timeout: Duration::from_secs(cli.timeout.max(1)),
        install: !cli.no_install,
    })
}

/// The region experiments run in-process: no contenders to discover.
/// How `bench region-speed` starts its children: this binary.
fn region_speed_child() -> Result<hh_suite::ChildCommand> {
    Ok(hh_suite::ChildCommand {
        program: std::env::current_exe().context("finding the canopy binary to run region-speed's children")?,
        args: vec!["bench".into(), "region-speed-child".into()],
    })
}

fn region_common(cli: &Cli, size: Size, runs: Option<usize>) -> RegionCommon {
    RegionCommon {
        size,
        runs,
        results_dir: results_dir(cli),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.cmd {
        Cmd::Tour(a) => tour(&cli, a),
        Cmd::Bench { experiment } => {
            let finished = match experiment {
                Experiment::Sac(a) => {
                    let c = common(&cli, a.size.size(), a.runs, &a.contenders)?;
                    let opts = sac::SacOptions {
                        xs: a.xs.clone(),
                        threads: a.threads.clone().unwrap_or_else(sac::default_threads),
                        n: a.n,
                        iters: a.iters,
                        rust: !a.no_rust,
                    };
                    sac::run(&c, &opts)?
                }
                Experiment::SacCallgrind(a) => {
                    let c = common(&cli, a.size.size(), None, &a.contenders)?;
                    let mut opts = sac_callgrind::CallgrindOptions {
                        xs: a.xs.clone(),
                        pairs: a.pairs,
                        rust: !a.no_rust,
                        ..Default::default()
                    };
                    if let Some(j) = a.jobs {
                        opts.jobs = j.max(1);
                    }
                    sac_callgrind::run(&c, &opts)?
                }
                Experiment::Workloads(a) => {
                    let c = common(&cli, a.size.size(), a.runs, &a.contenders)?;
                    let mut opts = workloads::WorkloadOptions {
                        scale: a.scale,
                        ..Default::default()
                    };
                    if let Some(t) = a.threads {
                        opts.threads = t.max(1);
                    }
                    if let Some(o) = &a.only {
                        opts.only = o.clone();
                    }
                    workloads::run(&c, &opts)?
                }
                Experiment::InProcess(a) => {
                    let c = common(&cli, a.size.size(), a.runs, &a.contenders)?;
                    let mut opts = in_process::InProcessOptions {
                        bursts: a.bursts,
                        scale: a.scale,
                        rust: !a.no_rust,
                        ..Default::default()
                    };
                    if let Some(o) = &a.only {
                        opts.only = o.clone();
                    }
                    in_process::run(&c, &opts)?
                }
                Experiment::RegionFrag(a) => {
                    let opts = region_frag::FragOptions {
                        steps: a.steps,
                        seed: a.seed,
                        parts: a.parts.clone(),
                        ..Default::default()
                    };
                    region_frag::run(&region_common(&cli, a.size.size(), None), &opts)?
                }
                Experiment::RegionSpeed(a) => {
                    let opts = region_speed::SpeedOptions {
                        n: a.n,
                        max_n: a.max_n,
                        child: Some(region_speed_child()?),
                        timeout: Duration::from_secs(cli.timeout.max(1)),
                        instructions: !a.no_instructions,
                        install: !cli.no_install,
                        ..Default::default()
                    };
                    region_speed::run(&region_common(&cli, a.size.size(), a.runs), &opts)?
                }
                Experiment::RegionPack(a) => {
                    let opts = region_pack::PackOptions {
                        bodies: a.bodies,
                        seed: a.seed,
                    };
                    region_pack::run(&region_common(&cli, a.size.size(), a.runs), &opts)?
                }
                Experiment::RcSac(a) => rc::run_sac(&rc_common(&cli, &a.rc), &a.xs)?,
                Experiment::RcKernel(a) => rc::run_kernel(&rc_common(&cli, a))?,
                Experiment::RcFft(a) => rc::run_fft(&rc_common(&cli, a))?,
                Experiment::RcReuse(a) => rc::run_reuse(&rc_common(&cli, a))?,
                Experiment::HhSuite(a) => {
                    let exe = std::env::current_exe()
                        .context("finding the canopy binary to run hh-suite's children")?;
                    let opts = hh_suite::HhOptions {
                        programs: a.programs.clone().unwrap_or_default(),
                        threads: a.threads.clone().unwrap_or_else(hh_suite::default_threads),
                        warmups: a.warmups,
                        seed: a.seed,
                        child: hh_suite::ChildCommand {
                            program: exe,
                            args: vec!["bench".into(), "hh-suite-child".into()],
                        },
                    };
                    let hc = hh_suite::HhCommon {
                        size: a.size.size(),
                        runs: a.runs,
                        results_dir: results_dir(&cli),
                        timeout: Duration::from_secs(cli.timeout.max(1)),
                    };
                    hh_suite::run(&hc, &opts)?
                }
                Experiment::RegionSpeedChild(a) => {
                    let line = region_speed::child_main(&region_speed::ChildArgs {
                        contender: a.contender.clone(),
                        config: a.config,
                        n: a.n,
                        max_n: a.max_n,
                        seed: a.seed,
                        rounds: a.rounds,
                    })?;
                    println!("{line}");
                    return Ok(ExitCode::SUCCESS);
                }
                Experiment::HhSuiteChild(a) => {
                    let line = hh_suite::child_main(&hh_suite::ChildArgs {
                        program: a.program.clone(),
                        variant: a.variant.clone(),
                        threads: a.threads,
                        n: a.n,
                        grain: a.grain,
                        seed: a.seed,
                        warmups: a.warmups,
                    })?;
                    println!("{line}");
                    return Ok(ExitCode::SUCCESS);
                }
            };
            print!("{}", finished.markdown);
            print_written(&finished);
            Ok(exit_for(&[finished]))
        }
        Cmd::Anchors { install } => anchors_cmd(*install),
        Cmd::Stats(a) => stats_cmd(a),
    }
}

fn print_written(f: &Finished) {
    let mut files = vec![
        f.written.json.display().to_string(),
        f.written.markdown.display().to_string(),
    ];
    if let Some(s) = &f.written.svg {
        files.push(s.display().to_string());
    }
    eprintln!("\n{}: wrote {}", f.name, files.join(", "));
}

/// Exit status 1 (after the report was written) when any run failed.
fn exit_for(done: &[Finished]) -> ExitCode {
    let failures: Vec<&String> = done.iter().flat_map(|f| &f.failures).collect();
    if failures.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!("\nerror: {} run(s) failed:", failures.len());
    for f in failures {
        eprintln!("  - {}", f.replace('\n', "\n    "));
    }
    ExitCode::FAILURE
}

/// One experiment of the tour.
type Step<'a> = Box<dyn Fn() -> Result<Finished> + 'a>;

fn tour(cli: &Cli, a: &TourArgs) -> Result<ExitCode> {
    // Quick-size tables go beside the full-size ones, never over them.
    let dir = cli
        .results_dir
        .clone()
        .unwrap_or_else(|| report::default_results_dir().join("tour"));
    println!("# Canopy tour\n");
    println!(
        "Every experiment at the quick size, against the anchor allocators. Results go to {}.\n",
        dir.display()
    );
    let mut c = common(cli, Size::Quick, a.runs, &a.contenders)?;
    c.results_dir = dir.clone();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let mut regc = region_common(cli, Size::Quick, a.runs);
    regc.results_dir = dir.clone();
    
    let rcc = rc::RcCommon {
        size: Size::Quick,
        runs: a.runs,
        results_dir: dir.clone(),
    };
    
    let hh_exe = std::env::current_exe().context("finding the canopy binary to run hh-suite's children")?;
    let hho = hh_suite::HhOptions {
        programs: Vec::new(),
        threads: hh_suite::default_threads(),
        warmups: 1,
        seed: 2023,
        child: hh_suite::ChildCommand {
            program: hh_exe,
            args: vec!["bench".into(), "hh-suite-child".into()],
        },
    };
    let hhc = hh_suite::HhCommon {
        size: Size::Quick,
        runs: a.runs,
        results_dir: dir.clone(),
        timeout: Duration::from_secs(cli.timeout.max(1)),
    };
    let steps: [(&str, Step); 12] = [
        (
            "sac",
            Box::new(|| {
                sac::run(
                    &c,
                    &sac::SacOptions {
                        rust: !a.no_rust,
                        ..Default::default()
                    },
                )
            }),
        ),
        (
            "sac-callgrind",
            Box::new(|| {
                sac_callgrind::run(
                    &c,
                    &sac_callgrind::CallgrindOptions {
                        rust: !a.no_rust,
                        ..Default::default()
                    },
                )
            }),
        ),
        (
            "workloads",
            Box::new(|| workloads::run(&c, &workloads::WorkloadOptions::default())),
        ),
        (
            "in-process",
            Box::new(|| in_process::run(&c, &in_process::InProcessOptions::default())),
        ),
        (
            "region-frag",
            Box::new(|| region_frag::run(&regc, &region_frag::FragOptions::default())),
        ),
        (
            "region-speed",
            Box::new(|| {
                let opts = region_speed::SpeedOptions {
                    child: Some(region_speed_child()?),
                    timeout: Duration::from_secs(cli.timeout.max(1)),
                    install: !cli.no_install,
                    ..Default::default()
                };
                region_speed::run(&regc, &opts)
            }),
        ),
        (
            "region-pack",
            Box::new(|| region_pack::run(&regc, &region_pack::PackOptions::default())),
        ),
        ("rc-sac", Box::new(|| rc::run_sac(&rcc, &[100, 25]))),
        ("rc-kernel", Box::new(|| rc::run_kernel(&rcc))),
        ("rc-fft", Box::new(|| rc::run_fft(&rcc))),
        ("rc-reuse", Box::new(|| rc::run_reuse(&rcc))),
        ("hh-suite", Box::new(|| hh_suite::run(&hhc, &hho))),
    ];
    for (name, step) in steps.iter() {
        eprintln!("== {name}");
        match step() {
            Ok(f) => {
                println!("{}", f.markdown);
                print_written(&f);
                done.push(f);
            }
            Err(e) => {
                eprintln!("error: {name}: {e:#}");
                errors.push(format!("{name}: {e:#}"));
            }
        }
    }
    let index = dir.join("README.md");
    println!(
        "---\n\nThe full report: {} (tables, SVG charts and raw JSON for each experiment).",
        index.display()
    );
    let code = exit_for(&done);
    if !errors.is_empty() {
        eprintln!("\nerror: {} experiment(s) could not run:", errors.len());
        for e in &errors {
            eprintln!("  - {e}");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(code)
}

fn anchors_cmd(install: bool) -> Result<ExitCode> {
    if install {
        let missing: Vec<&str> = ANCHORS
            .iter()
            .filter(|a| anchors::find_anchor(a).is_none())
            .map(|a| a.package)
            .collect();
        if missing.is_empty() {
            println!("All anchors are installed.");
        } else {
            anchors::apt_install(&missing).context("installing the anchors")?;
        }
    }
    let mut t = report::Table::new(["contender", "library", "Debian package", "status"]);
    t.row([
        "glibc".to_string(),
        "(none: the C library's malloc)".into(),
        "libc6".into(),
        "built in".into(),
    ]);
    let canopy = canopy_bench::artifacts::CANOPY_MALLOC.locate(Lookup::FindOnly);
    t.row([
        "canopy".to_string(),
        "libcanopy_malloc.so".into(),
        "(this workspace)".into(),
        match &canopy {
            Ok(p) => p[0].display().to_string(),
            Err(_) => "not built (experiments build it with cargo)".into(),
        },
    ]);
    let mut missing = 0;
    for a in ANCHORS {
        let status = match anchors::find_anchor(a) {
            Some(p) => format!(
                "{} ({})",
                p.display(),
                anchors::package_version(a.package).unwrap_or_else(|| "version unknown".into())
            ),
            None => {
                missing += 1;
                "missing".into()
            }
        };
        t.row([a.name.to_string(), a.lib.into(), a.package.into(), status]);
    }
    print!("{}", t.render());
    if missing > 0 {
        let pkgs: Vec<&str> = ANCHORS
            .iter()
            .filter(|a| anchors::find_anchor(a).is_none())
            .map(|a| a.package)
            .collect();
        println!("\n{missing} anchor(s) missing: `canopy anchors --install` (as root) or `apt-get install {}`.", pkgs.join(" "));
    }
    match canopy_bench::experiments::sac_callgrind::find_valgrind() {
        Some(v) => println!("valgrind: {}", v.display()),
        None => println!("valgrind: missing (needed by sac-callgrind: `apt-get install valgrind`)"),
    }
    Ok(ExitCode::SUCCESS)
}

fn stats_cmd(a: &StatsArgs) -> Result<ExitCode> {
    use canopy::alloc as ca;
    let threads = a.threads.max(1);
    let ops = a.ops;
    // A small mixed workload on Canopy's Rust API: sized and class
    // allocations of 16 B .. 64 KiB, a quarter of them freed by the next
    // thread (remote frees), the rest by their own thread.
    let classes: Vec<ca::SizeClass> = [16usize, 48, 100, 256, 1000, 4096]
        .iter()
        .filter_map(|&s| ca::SizeClass::of(s))
        .collect();
    let handoff: Vec<std::sync::Mutex<Vec<usize>>> = (0..threads)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (classes, handoff) = (&classes, &handoff);
            s.spawn(move || {
                let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1);
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut live: Vec<(usize, usize)> = Vec::new();
                let mut remote = Vec::new();
                for i in 0..ops {
                    let r = rnd();
                    if r % 3 == 0 && !classes.is_empty() {
                        let cls = classes[(r >> 8) as usize % classes.len()];
                        let p = ca::alloc_class(cls);
                        if !p.is_null() {
                            // SAFETY: p came from alloc_class(cls) and is freed once.
                            unsafe { ca::free_class(p, cls) };
                        }
                    } else {
                        let size =
                            16 + (r >> 16) as usize % if i % 64 == 0 { 65_536 } else { 1024 };
                        let p = ca::alloc(size);
                        if p.is_null() {
                            continue;
                        }
                        if r % 4 == 1 {
                            remote.push(p as usize);
                        } else {
                            live.push((p as usize, size));
                        }
                    }
                    if live.len() > 256 {
                        let (p, size) = live.swap_remove((r >> 24) as usize % live.len());
                        // SAFETY: p came from alloc(size) and is freed once.
                        unsafe { ca::free_sized(p as *mut u8, size) };
                    }
                }
                for (p, _) in live {
                    // SAFETY: p came from alloc and is freed once.
                    unsafe { ca::free(p as *mut u8) };
                }
                handoff[(t + 1) % threads]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(remote);
            });
        }
    });
    // Free the handed-off blocks from threads that did not allocate them.
    std::thread::scope(|s| {
        for h in &handoff {
            s.spawn(move || {
                for p in h.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                    // SAFETY: p came from alloc and is freed once, here.
                    unsafe { ca::free(p as *mut u8) };
                }
            });
        }
    });
    println!("Canopy allocator statistics after {threads} thread(s) x {ops} allocations (16 B .. 64 KiB, a quarter freed remotely):\n");
    println!("{}", ca::stats::snapshot());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_from_flags() {
        let cli = Cli::try_parse_from([
            "canopy",
            "bench",
            "sac",
            "--paper",
            "--threads",
            "1,2",
            "--x",
            "25",
        ])
        .unwrap();
        let Cmd::Bench {
            experiment: Experiment::Sac(a),
        } = cli.cmd
        else {
            panic!("not sac")
        };
        assert_eq!(a.size.size(), Size::Paper);
        assert_eq!(a.threads, Some(vec![1, 2]));
        assert_eq!(a.xs, vec![25]);
        assert!(Cli::try_parse_from(["canopy", "bench", "sac", "--quick", "--paper"]).is_err());
    }

    #[test]
    fn region_benches_parse() {
        let cli = Cli::try_parse_from([
            "canopy",
            "bench",
            "region-frag",
            "--quick",
            "--parts",
            "a,c",
            "--steps",
            "500",
        ])
        .unwrap();
        let Cmd::Bench {
            experiment: Experiment::RegionFrag(a),
        } = cli.cmd
        else {
            panic!("not region-frag")
        };
        assert_eq!(a.parts, vec!["a", "c"]);
        assert_eq!((a.steps, a.size.size()), (Some(500), Size::Quick));
        let cli = Cli::try_parse_from([
            "canopy",
            "bench",
            "hh-suite",
            "--quick",
            "--threads",
            "1,2",
            "--programs",
            "fib,wc",
        ])
        .unwrap();
        let Cmd::Bench {
            experiment: Experiment::HhSuite(h),
        } = cli.cmd
        else {
            panic!("not hh-suite")
        };
        assert_eq!(
            (h.size.size(), h.threads, h.programs),
            (
                Size::Quick,
                Some(vec![1, 2]),
                Some(vec!["fib".into(), "wc".into()])
            )
        );
        for e in ["region-speed", "region-pack"] {
            assert!(Cli::try_parse_from(["canopy", "bench", e, "--paper", "--runs", "2"]).is_ok());
        }
    }
}
