//! Load safetensors checkpoints as fast as the storage under them allows, on any filesystem.
//!
//! `safeload` loads a single `.safetensors` file or a sharded checkpoint
//! (`model.safetensors.index.json`) into zero-copy [`Tensor`] views. Each file
//! is either memory-mapped or read into one aligned buffer ("buffered"); by
//! default the choice is made per file from the filesystem it lives on, since
//! mmap is free on a local disk but stalls on FUSE mounts such as `hf-mount`.
//! The [`LoadReport`] says what was chosen, why, and how fast each file went.
//!
//! Engines rarely want a whole state dict at once: a [`Checkpoint`] opens a
//! checkpoint from its headers alone and reads exactly what is asked for (a
//! tensor, a rank's tensor-parallel part, a slice, a stream of tensors under
//! a memory cap), converting dtypes on the way ([`Loader::dtype`]); the
//! `candle` feature plugs it into candle's `VarBuilder`. With the `remote`
//! feature every call that takes a path also takes the address of a checkpoint
//! in an object store or on the Hugging Face hub (`s3://bucket/prefix`,
//! `hf://org/repo@revision`, `https://host/dir/`), read by ranged requests
//! with no mount and no download (README, "Remote checkpoints"); `hf://`
//! through the Hugging Face cache the hub's own clients share, so that a
//! restart loads from the local disk.
//!
//! # Which call do I use
//!
//! | task | the call |
//! |---|---|
//! | load everything, the strategy decided per file | [`load_state_dict(path, None)`](load_state_dict) |
//! | load everything read into memory (or mapped) | [`load_state_dict(path, Some(true))`](load_state_dict), or [`Loader::disable_mmap`] |
//! | set threads, reads in flight, conversion, checks | [`Loader`], then [`Loader::load`] |
//! | headers only, then the tensors an engine asks for | [`Checkpoint::open`], then [`Checkpoint::read`] |
//! | a rank's tensor-parallel part (and which rows it is) | [`Checkpoint::shard`] ([`TensorInfo::shard_range`]) |
//! | a slice of a tensor | [`Checkpoint::read_slice`] |
//! | into memory the engine owns | [`Checkpoint::read_into`] |
//! | a subset of the tensors, as a state dict | [`Checkpoint::load_filtered`] |
//! | everything, under a memory cap | [`Checkpoint::for_each`] |
//! | into a GPU's memory through a small ring of pinned buffers, no host copy (a rank's part, converted) | [`device::LoadToDevice::load_to_device`], [`device::ToDevice::to_device`], [`device::ToDevice::to_device_parts`] (the crate `safeload-device`; the GPU: feature `cuda`) |
//! | convert floating tensors on the way | [`Loader::dtype`] (one tensor: [`Tensor::to_dtype`]) |
//! | warm the page cache first, split across local ranks | [`Loader::prefetch`] |
//! | warm it alone, for a job script | [`Loader::warm`] |
//! | check each file's SHA-256 | [`Loader::verify`] |
//! | from async code, without blocking the executor; cancel | [`Loader::load_async`], [`Loader::open_async`]; [`Loader::cancel_on`] |
//! | what was chosen and why, how fast | [`StateDict::report`] ([`report`]) |
//! | whether the local ranks shared one copy, who made it | [`FileReport::node_copy`](report::FileReport::node_copy) ([`report::NodeCopy`]) |
//! | the report as JSON (feature `serde`) | `serde_json::to_string(sd.report())`, the schema in [the report module](report#json) |
//! | tell "missing" from "corrupt" | [`Error::is_not_found`], [`Error::is_corrupt`] |
//! | why a remote load failed: repository, revision or file not found, no access, gated, offline, unreachable (feature `remote`) | [`Error::remote_failure`] ([`RemoteFailure`]); a bad address: [`ErrorKind::BadAddress`] |
//! | is a path on hf-mount / FUSE | [`mount::lookup`] (its [`kind`](mount::Mount::kind)) |
//! | load from S3, GCS, Azure, HTTP or the hub (feature `remote`) | any of the above with `s3://…`, `hf://org/repo@rev`, `https://…` for the path |
//! | restart from the Hugging Face cache, filled as the hub's clients fill it (feature `remote`) | `hf://…` reads and writes it by default ([`Loader::hub_cache`]); the commit to pin the next start to: [`LoadReport::commit`](report::LoadReport::commit); what it holds: `hub_cache()`; the config and tokenizer at the weights' commit: `hf://…?with=engine`, [`LoadReport::extra_files`](report::LoadReport::extra_files); a revision or a repository removed, or the cache pruned, with a dry run: `hub_cache_remove()`, `hub_cache_prune()` |
//! | keep what `s3://`, `gs://`, `az://`, `https://` loads fetched (feature `remote`) | [`Loader::cache_dir`] |
//!
//! # Loading
//!
//! The one-liner takes a path and `disable_mmap: Option<bool>` (`None`
//! decides for you):
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 2], &data)?;
//! # safetensors::serialize_to_file([("model.embed.weight", view)], None, &path)?;
//! let sd = safeload::load_state_dict(&path, None)?;
//!
//! for (name, tensor) in sd.iter() {                 // file order, deterministic
//!     println!("{name}: {} {:?}, {} bytes", tensor.dtype(), tensor.shape(), tensor.as_bytes().len());
//! }
//! let w: &[f32] = sd.get("model.embed.weight").unwrap().as_slice()?; // zero-copy, checked
//! assert_eq!(w, [1.0, 2.0, 3.0, 4.0]);
//! eprintln!("{}", sd.report());                    // per file: filesystem, strategy, why, time
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `path` may be a `.safetensors` file, a `*.safetensors.index.json`, or a
//! directory holding `model.safetensors`, `model.safetensors.index.json` or
//! exactly one `*.safetensors` file.
//!
//! The [`Loader`] builder sets everything else, as one expression:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let data = vec![0u8; 8];
//! # for (i, name) in ["model.layers.0.w", "model.layers.1.w"].iter().enumerate() {
//! #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4], &data)?;
//! #     safetensors::serialize_to_file([(*name, view)], None, &dir.path().join(format!("s{i}.safetensors")))?;
//! # }
//! # std::fs::write(dir.path().join("model.safetensors.index.json"),
//! #     r#"{"weight_map": {"model.layers.0.w": "s0.safetensors", "model.layers.1.w": "s1.safetensors"}}"#)?;
//! use safeload::Loader;
//!
//! let sd = Loader::new()
//!     .disable_mmap(true)          // read into memory; false maps; unset decides per file
//!     .threads(8)                  // files opened and parsed at once
//!     .io_concurrency(8)           // reads in flight for buffered files
//!     .filter(|name| name.starts_with("model.layers.0."))
//!     .load(dir.path())?;          // a directory with an index: shards load in parallel
//!
//! let w = sd.get("model.layers.0.w").unwrap();
//! let as_f32: Vec<f32> = w.to_f32()?;          // BF16 -> f32 with `half`
//! assert_eq!(as_f32.len(), 4);
//! assert_eq!(sd.report().files.len(), 1);       // the other shard was never opened
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Choosing mmap or buffered
//!
//! | `disable_mmap` | `SAFELOAD_DISABLE_MMAP` | strategy |
//! |---|---|---|
//! | `Some(true)` / `.disable_mmap(true)` | ignored | buffered |
//! | `Some(false)` / `.disable_mmap(false)` | ignored | mmap |
//! | `None` / unset | `1` | buffered |
//! | `None` / unset | `0` | mmap |
//! | `None` / unset | unset | per file, from its filesystem (see [`mount`]) |
//!
//! If mapping a file fails (some FUSE filesystems answer `ENODEV`), that file
//! is read buffered instead and the report says so.
//!
//! # Reports and errors
//!
//! Every decision is data: a file's [`report::Reason`] (the rule that chose
//! its strategy), its [`report::Fallback`] (what overrode it), its
//! [`report::DirectIo`] and its [`report::NodeCopy`] (who made the copy its
//! local ranks share, or why there was none), a prefetch's
//! [`report::RankSource`] and [`report::SkipReason`]s, and everything else a
//! report says, each field typed by an enum of its own
//! ([`report::LoadNote`]: what went otherwise than planned;
//! [`report::ConcurrencyReason`]: how the reads in flight were found;
//! [`report::PrefetchReason`], [`report::QueueNote`],
//! [`report::CopyRemark`]), each with `Display` for the words and, where it
//! has data, `as_str()` for a stable code; the whole report prints as a
//! table, and with the `serde` feature serializes in one schema under the
//! Rust names, the one `safeload load --json` prints
//! ([the report module's "JSON"](report#json), with a complete example).
//! Errors say the file, and programs branch on [`Error::is_not_found`] and
//! [`Error::is_corrupt`] without reading strings:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])?;
//! # safetensors::serialize_to_file([("w", view)], None, &path)?;
//! use safeload::mount::MountKind;
//! use safeload::report::{Reason, Strategy};
//!
//! let sd = safeload::load_state_dict(&path, Some(true))?;
//! let file = &sd.report().files[0];
//! assert_eq!((file.strategy, file.reason), (Strategy::Buffered, Reason::Requested { disable_mmap: true }));
//! eprintln!("{}", file.explain());             // the reason in words
//! # let _ = MountKind::Fuse;
//!
//! match safeload::load_state_dict(dir.path().join("other"), None) {
//!     Err(e) if e.is_not_found() => eprintln!("not downloaded yet: {e}"),
//!     Err(e) if e.is_corrupt() => eprintln!("download it again: {e}"),
//!     Err(e) => return Err(e.into()),          // the storage failed
//!     Ok(_) => unreachable!(),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Environment
//!
//! | variable | effect | overridden by |
//! |---|---|---|
//! | `SAFELOAD_DISABLE_MMAP=1` / `0` | read buffered / map, instead of the auto choice | [`Loader::disable_mmap`] |
//! | `SAFELOAD_PREFETCH=<streams>` (`HF_SHARD_PREFETCH`) | warm the page cache first | [`Loader::prefetch`] |
//! | `SAFELOAD_VERIFY=1` / `0` | check each file's SHA-256 | [`Loader::verify`] |
//! | `SAFELOAD_HUGE_PAGES=1` / `0` / `auto` | back buffered loads' memory with transparent huge pages, or not, or measure which costs less | [`Loader::huge_pages`] |
//! | `LOCAL_RANK`/`LOCAL_WORLD_SIZE`, `SLURM_LOCALID`, Open MPI's, MPICH's | this process's local rank, for prefetch and the node copy | [`Loader::local_rank`] |
//! | `SAFELOAD_JOB_ID=<id>` | the job's identity: what keys its ranks' shared queue and node copy (see "One job, one copy per node") | — |
//! | `SAFELOAD_EXCHANGE=mpi`, `SAFELOAD_NODE_ID`, `SAFELOAD_EXCHANGE_TIMEOUT_SECS` | the nodes of a job read each byte once between them (feature `mpi`; README, "Many nodes") | [`Loader::exchange`] |
//! | `SAFELOAD_HUB_CACHE=0` | `hf://` streams, the Hugging Face cache neither read nor written | [`Loader::hub_cache`] |
//! | `HF_HUB_CACHE`, `HF_HOME` | where the Hugging Face cache is (else `~/.cache/huggingface/hub`) | — |
//! | `HF_HUB_OFFLINE=1` | `hf://` asks the hub nothing: what the cache lacks is an error | — |
//! | `SAFELOAD_CACHE_DIR=<dir>` | `s3://`, `gs://`, `az://`, `http(s)://` read and write a cache there | [`Loader::cache_dir`] |
//! | `SAFELOAD_REMOTE_STALL_SECS=<s>` | a remote request that moves less than 64 KiB in this many seconds (default 10) has stalled: dropped, tried once more, then an error naming the file, server and byte; a load waiting for another process's write of a file to a cache stops waiting once that write shows no progress for as long | — |
//!
//! # Memory
//!
//! Tensors hold an [`Arc`](std::sync::Arc) of their file's storage and a byte
//! range: nothing is copied after the read. A buffered load therefore peaks at
//! about one copy of the selected tensors; the header is read first and only
//! the tensors' bytes are allocated, each at an offset aligned for its dtype
//! (also for files written without alignment), so [`Tensor::as_slice`] works
//! on every buffered tensor. A mapped load costs page cache, shared with every
//! other process mapping the same files.
//!
//! That memory is fresh: the kernel backs each page before a read can land
//! in it, which on many hosts costs more than the storage. A load faults its
//! destinations in ahead of (or just before) the reads, in the page size
//! [`Loader::huge_pages`] asks for, else the one it measures cheaper as it
//! goes (transparent huge pages cost a quarter of base pages where free ones
//! are at hand, and many times more where the kernel or a virtual machine's
//! host must make them); [`LoadReport::fresh_memory`] says which.
//!
//! # Threads
//!
//! Everything a load does that blocks on storage (opening and parsing files,
//! buffered reads, prefetch streams, hashing) runs on threads of the crate's
//! own, never in the caller's rayon pool, because a slow network mount must
//! not starve the process's CPU work: [`Loader::threads`] bounds the files
//! handled at once (by default the machine's parallelism, or the rayon
//! pool's size when called from inside one), [`Loader::io_concurrency`] the
//! reads in flight. Where the OS refuses a thread (`RLIMIT_NPROC`, a cgroup's
//! `pids.max`), the load runs on the threads it got, the calling one at
//! least, and [`LoadReport::notes`](report::LoadReport::notes) says so.
//!
//! # Prefetch
//!
//! On a cold network filesystem, faulting a map in tensor by tensor reads far
//! below what the storage sustains; a few large sequential readers per
//! process, warming the page cache first, make the load run at streaming
//! speed and leave one shared page-cache copy per node. [`Loader::prefetch`]
//! (or `SAFELOAD_PREFETCH=<streams>`, or `HF_SHARD_PREFETCH`) turns it on;
//! [`Loader::warm`] does it alone, for a job script that warms, waits at a
//! barrier, then loads:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let data = vec![0u8; 1 << 16];
//! # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 16], &data)?;
//! # safetensors::serialize_to_file([("w", view)], None, &path)?;
//! use safeload::Loader;
//!
//! let sd = Loader::new().prefetch(4).load(&path)?;        // warm with 4 streams, then load
//! eprintln!("{}", sd.report().prefetch.as_ref().unwrap()); // what it warmed, skipped, and why
//!
//! let report = Loader::new().prefetch(8).warm(&path)?;    // warm only
//! assert_eq!(report.total_bytes, std::fs::metadata(&path)?.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! In a torchrun job, every process of a node runs the same code; torchrun's
//! `LOCAL_RANK` and `LOCAL_WORLD_SIZE` tell each its share, and the shares
//! meet in one queue, so the node reads each byte once:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let data = vec![0u8; 64 * 32 * 2];
//! # let mut weight_map = std::collections::BTreeMap::new();
//! # for i in 0..2 {
//! #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
//! #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
//! #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
//! #     weight_map.insert(name, file);
//! # }
//! # let index = dir.path().join("model.safetensors.index.json");
//! # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
//! // torchrun --nproc-per-node 8 train.py  (here: the one process of a job of one)
//! # let rank_vars = [("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")];
//! let local_rank = std::env::var("LOCAL_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
//! let loader = safeload::Loader::new()
//!     .local_rank(local_rank, 1)     // what LOCAL_RANK / LOCAL_WORLD_SIZE give; unset, read from them
//!     .prefetch(4);                  // 4 readers in this process
//! let sd = loader.load(&index)?;     // this rank's share warmed, then everything loaded
//! let p = sd.report().prefetch.as_ref().unwrap();
//! assert_eq!((p.rank, p.local_size), (0, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - The processes of a job on one node (from `LOCAL_RANK`/`LOCAL_WORLD_SIZE`,
//!   `SLURM_LOCALID`/`SLURM_NTASKS_PER_NODE`, Open MPI's or MPICH's local
//!   rank variables, or [`Loader::local_rank`]) split the bytes, never by
//!   global rank, through one queue of chunks in a small file in `/dev/shm`:
//!   a process that finishes early takes chunks from a slower one, one that
//!   dies has its chunks taken over, and no chunk is read twice on a node.
//! - Chunks already in the page cache are not read (`mincore(2)`), so a warm
//!   load pays for a check; what did not land is read once more.
//! - The memory guard warms at most 90 % of the memory available (the
//!   smaller of `MemAvailable` and the cgroup's room), counting what is
//!   resident; what it leaves cold, and why, is in the
//!   [`PrefetchReport`](report::PrefetchReport).
//! - With prefetch unset, the auto policy turns it on (4 streams) for files
//!   on a kernel network filesystem that will be mapped, when they are not
//!   already resident and fit the guard.
//!
//! # One job, one copy per node
//!
//! Where several local ranks of a job load the same files read buffered
//! (FUSE, hf-mount, a remote store), they fill one copy per file in
//! node-shared memory, each chunk read once on the node, and each maps it
//! read-only; one rank alone reads as before. Each file's
//! [`FileReport::node_copy`](report::FileReport::node_copy) says which rank
//! made the copy, from which process this one took it and how many chunks it
//! filled, or why there was none ([`report::NodeCopy`]).
//!
//! What makes processes one job is the job's identity, which keys the shared
//! queue of prefetch and the node copy, together with the files (device,
//! inode, size and modification time; a remote object's address, length and
//! ETag), the chunk size and the user:
//!
//! 1. `SAFELOAD_JOB_ID`, where set (by hand or by the job script);
//! 2. else the launcher's job id: torchrun's `TORCHELASTIC_RUN_ID`, Slurm's
//!    `SLURM_JOB_ID` and `SLURM_STEP_ID`, Open MPI's `OMPI_MCA_ess_base_jobid`;
//! 3. else the parent process: the ranks one launcher starts on a node are
//!    its children (MPICH's Hydra, a shell script's `&`).
//!
//! Two jobs on a node with the same identity (two runs of one script under
//! one parent, or a launcher id reused) share the copy of the files both
//! load, which costs nothing but their memory living as long as either
//! holds it; set `SAFELOAD_JOB_ID` apart to keep them apart, or alike to
//! make processes no launcher groups one job. Every rank of a job must see
//! the same value. No other user's process can join: the queue and the
//! copy's names are this user's, and each name is checked before use.
//!
//! # Reading only what is needed
//!
//! [`Checkpoint::open`] (or [`Loader::open`], with the loader's options)
//! reads the headers, in milliseconds whatever the checkpoint's size; then
//! reads follow the same per-file rules as a load (a view of the map where
//! mapped, positional reads of exactly the bytes needed where not). A rank of
//! a tensor-parallel job reads its part of each tensor and nothing else:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let data = vec![0u8; 64 * 32 * 2];
//! # let mut weight_map = std::collections::BTreeMap::new();
//! # for i in 0..2 {
//! #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
//! #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
//! #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
//! #     weight_map.insert(name, file);
//! # }
//! # let index = dir.path().join("model.safetensors.index.json");
//! # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
//! use safeload::Checkpoint;
//!
//! let (rank, world) = (1, 4);
//! let ck = Checkpoint::open(&index)?;
//! for info in ck.tensors() {
//!     if info.shape().is_empty() || info.shape()[0] % world != 0 {
//!         continue; // replicated: read whole with ck.read(name)
//!     }
//!     // Row-parallel along dimension 0: one read (a view where mapped).
//!     let part = ck.shard(info.name(), 0, rank, world)?;
//!     assert_eq!(part.shape()[0], info.shape()[0] / world);
//! }
//! let block = ck.read_slice("model.layers.0.mlp.up.weight", &[0..8, 0..16])?;
//! assert_eq!(block.shape(), [8, 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A checkpoint larger than memory streams, in file order, readers working
//! ahead up to a cap of bytes in flight, each tensor's bytes released when
//! the callback drops it (the shape a GPU upload needs); the callback may
//! return the engine's own error type:
//!
//! ```
//! # let dir = tempfile::tempdir()?;
//! # let data = vec![0u8; 64 * 32 * 2];
//! # let mut weight_map = std::collections::BTreeMap::new();
//! # for i in 0..2 {
//! #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
//! #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
//! #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
//! #     weight_map.insert(name, file);
//! # }
//! # let index = dir.path().join("model.safetensors.index.json");
//! # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
//! let ck = safeload::Loader::new().open(&index)?;
//! let mut uploaded = 0u64;
//! ck.for_each(256 << 20, |tensor| -> Result<(), safeload::Error> {
//!     uploaded += tensor.nbytes(); // e.g. copy to the device, then drop
//!     Ok(())
//! })?;
//! assert_eq!(uploaded, ck.total_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Converting dtypes
//!
//! [`Loader::dtype`] converts every floating tensor (F64, F32, F16, BF16,
//! F8_E4M3, F8_E5M2) to F32, F16 or BF16 while it is read, in parallel, into
//! its final allocation; [`Tensor::to_dtype`] converts one tensor.
//! Rounding is to nearest even, overflow gives
//! infinity (counted in the report), NaN stays NaN.
//!
//! # Progress and events
//!
//! [`Loader::on_progress`] hands the caller bytes and files done out of their
//! totals, about 20 times a second, for reads, prefetch and streaming; the
//! library prints nothing. With the `tracing` feature, each file's strategy
//! and why, prefetch decisions and timings are `tracing` events.
//!
//! # Safety and limits
//!
//! Every file is treated as hostile: the header length is checked against the
//! file size and a 100 MB cap before anything is allocated; the header is
//! parsed by the `safetensors` crate's rules, which check dtypes, shapes,
//! offsets and byte lengths with checked arithmetic and refuse JSON nested
//! deeper than 127 arrays and objects (serde_json's recursion limit), in one
//! pass of the crate's own; duplicate tensor names (which the reference
//! resolves to the last entry), truncated
//! files and trailing bytes are refused; an index may only name plain files
//! in its own directory. Each of these is a typed [`ErrorKind`] naming the
//! file, never a panic.
//!
//! One load sees one version of every file: a directory is opened once and
//! every file relative to it, once: every byte of the load is read through
//! that one descriptor (direct I/O is `O_DIRECT` set on it, never a second
//! open, which a FUSE daemon would resolve by path again); so a file replaced
//! by `rename`, or a `current -> snapshots/<rev>` symlink flipped, during a
//! load gives the old version or the new one, never a mix, also on FUSE. A buffered load that
//! would not fit in memory with a margin (32 MiB, 2 MiB per file, 1/512 of
//! the bytes) is mapped instead (auto) or refused
//! ([`ErrorKind::InsufficientMemory`]), never left to the OOM killer.
//! [`Loader::verify`] checks each file's SHA-256 against its Hugging Face
//! cache blob's name or [`Loader::expect_sha256`].
//!
//! What is not checked: a mapped file that another process truncates *after*
//! the load can make the process receive `SIGBUS` when a tensor's missing page
//! is touched (the contract of every file map). Where files may change under
//! you, load buffered.
//!
//! # Crate features
//!
//! - `candle` (off): the crate `safeload-candle` as `safeload::candle`:
//!   `to_candle` of a tensor, `into_candle` of a state dict (its traits
//!   `ToCandle` and `IntoCandle`), and a lazy candle `VarBuilder` over a
//!   [`Checkpoint`], plus a sharded one for tensor parallelism.
//! - `tracing` (off): `tracing` events for each file's strategy, prefetch
//!   decisions and timings.
//! - `serde` (off): `serde::Serialize` for the reports ([`report`]) and
//!   mounts ([`mount::Mount`]), in the schema of `safeload load --json`
//!   ([the report module's "JSON"](report#json)).
//! - `remote` (off): every call that takes a path also takes `s3://`,
//!   `gs://`, `az://`, `http(s)://` and `hf://org/repo@revision` addresses,
//!   read by ranged requests on a runtime of the crate's own (`object_store`);
//!   credentials from each store's usual variables (README, "Remote
//!   checkpoints"); `hf://` through the Hugging Face cache
//!   ([`Loader::hub_cache`]), the others through a cache directory where one
//!   is named ([`Loader::cache_dir`]).
//! - `cuda` (off): [`device`]'s `Cuda`, an NVIDIA GPU as the device a load
//!   places tensors in (cudarc, the driver loaded at run time: the feature
//!   builds without CUDA; no CUDA version pinned). Without it the device path
//!   runs on [`device::StandIn`], or on an engine's own [`device::Device`].
//! - `candle-cuda` (off): `candle` and `cuda`, and candle's own `cuda` (the
//!   candle crate's feature `cuda`): a
//!   load to a GPU as candle tensors on `Device::Cuda` and a `VarBuilder`
//!   over them (`safeload::candle::cuda`). candle's kernels are compiled with
//!   `nvcc` (README, "Weights straight to a GPU").
//! - `mpi` (off): [`Loader::exchange`]'s MPI implementation (the crate
//!   `safeload-mpi`), selected by `SAFELOAD_EXCHANGE=mpi`, so that the nodes of a job read each byte once
//!   between them (needs an MPI library, Open MPI or MPICH, and libclang to
//!   build; README, "Many nodes"). Without it an engine can still pass its
//!   own [`cluster::Communicator`].
//!
//! Mount detection works on Linux; elsewhere every filesystem is "unknown"
//! and files are mapped.
//!
//! # Versions
//!
//! [`Dtype`] is the `safetensors` crate's own type, re-exported: the major
//! version of `safetensors` safeload depends on (0.8) is part of safeload's
//! semver contract, and moving to another is a breaking change of safeload.
#![deny(missing_docs)]

// The facade: the core's items an engine names, each once, and the plug-ins'
// by feature. Everything here is `safeload_core`'s (crates/core) but the
// extras this build reads with ([`extras::Builtin`]) and what names them.
pub use safeload_core::{
    Dtype, Element, Error, ErrorKind, HugePages, LoadReport, RemoteFailure, Result, StateDict,
    Tensor, TensorInfo,
};
pub use safeload_core::{cluster, mount, report};

/// Loads a checkpoint: the builder of every option (see the methods), with
/// the extras this build reads beyond local paths ([`extras::Builtin`]:
/// `hf://`, `s3://`, `https://`, ... with the feature `remote`).
pub type Loader = safeload_core::Loader<extras::Builtin>;

/// A checkpoint opened from its headers alone, for reads of what an engine
/// asks for (see the methods); with the extras this build reads beyond local
/// paths ([`extras::Builtin`]).
pub type Checkpoint = safeload_core::Checkpoint<extras::Builtin>;

/// Loads a checkpoint: a `.safetensors` file, a `*.safetensors.index.json`,
/// a directory holding one of them, or (feature `remote`) the address of one.
///
/// `disable_mmap`: `Some(true)` reads every file into memory, `Some(false)`
/// maps every file, `None` decides per file from its filesystem (and the
/// `SAFELOAD_DISABLE_MMAP` environment variable). The same as
/// `Loader::new().disable_mmap(..).load(path)`.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &[0u8; 4])?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// let sd = safeload::load_state_dict(&path, None)?;             // decided per file
/// let buffered = safeload::load_state_dict(&path, Some(true))?; // read into memory
/// assert_eq!(sd.names().collect::<Vec<_>>(), buffered.names().collect::<Vec<_>>());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// A path that does not exist or holds no checkpoint
/// ([`Error::is_not_found`]), a file that breaks the format
/// ([`Error::is_corrupt`]), a failed read, or a buffered load that does not
/// fit in memory ([`ErrorKind::InsufficientMemory`]); each names the file.
pub fn load_state_dict(
    path: impl AsRef<std::path::Path>,
    disable_mmap: Option<bool>,
) -> Result<StateDict> {
    let loader = Loader::new();
    match disable_mmap {
        Some(disable) => loader.disable_mmap(disable),
        None => loader,
    }
    .load(path)
}

pub mod extras;

/// Weights straight into device memory (the crate `safeload-device`): the
/// [`Device`](device::Device) seam and its contract, a CPU stand-in
/// ([`StandIn`](device::StandIn)), an NVIDIA GPU with the feature `cuda`, and
/// the loads, [`ToDevice`](device::ToDevice) on `Checkpoint` and
/// [`LoadToDevice`](device::LoadToDevice) on `Loader`: a few staging buffers
/// the readers fill in file order and the device copies from, never the
/// checkpoint in host memory.
pub mod device {
    pub use safeload_device::*;
}

#[cfg(feature = "candle")]
pub mod candle;

/// The crate's errors: [`Error`], what went wrong ([`ErrorKind`]), what an
/// I/O call that failed was doing ([`Operation`](error::Operation)), and why a
/// remote request failed ([`RemoteFailure`]).
pub mod error {
    pub use safeload_core::{Error, ErrorKind, Operation, RemoteFailure, Result};
}

/// The Hugging Face cache outside any load (feature `remote`): what it holds
/// ([`hub_cache`](hub::hub_cache)), a revision or a repository removed
/// ([`hub_cache_remove`](hub::hub_cache_remove)), what downloads that died
/// left pruned ([`hub_cache_prune`](hub::hub_cache_prune)), and the types they
/// answer with.
#[cfg(feature = "remote")]
pub mod hub {
    pub use safeload_hub::{
        CacheEntryKind, CacheListing, CacheRemoval, CachedFile, CachedRepo, CachedRevision,
        KeepReason, KeptEntry, RemoveMode, RemovedEntry, hub_cache, hub_cache_prune,
        hub_cache_remove,
    };
}

// Test seams and the CLI's, benchmarks' and fuzzers' helpers: public for
// them, out of the documented API.
#[doc(hidden)]
pub use safeload_core::{
    __fuzz, AutoPolicy, DISABLE_MMAP_ENV, ENV_VARIABLES, HF_SHARD_PREFETCH_ENV, HUGE_PAGES_ENV,
    MAX_HEADER_LEN, NODE_COPY_ENV, PREFETCH_ENV, PrefetchOptions, ReadMode, VERIFY_ENV, convert,
    demo, evict,
};
