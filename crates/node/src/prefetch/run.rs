//! One prefetch from open files to its report: the chunks planned once, the queue opened (shared or this process's own), the readers started, what landed counted.

use std::path::Path;
use std::time::Instant;

use super::plan::{ChunkPlan, Init, reader_plan};
use super::queue::{Layout, init_from_header};
use super::queue_file::Queue;
use super::residency::{Target, initial_states, resolve_method};
use super::worker::{Outcome, Work};
use crate::coord::Owner;
use crate::error::Result;
use crate::extras::{DEFAULT_CHUNK, Job, LocalRank, PrefetchOptions, job_key};
use crate::os;
use crate::policy::PrefetchMethod;
use crate::progress::{Meter, Phase};
use crate::report::{PrefetchReason, PrefetchReport, QueueNote};

/// A prefetch planned once, whether the auto policy looks at it first or not.
pub(super) struct Plan {
    pub targets: Vec<Target>,
    pub chunks: ChunkPlan,
    pub rank: LocalRank,
    /// Residency and the guard's decision, where the auto policy checked.
    checked: Option<Init>,
}

impl Plan {
    /// The chunks of these files at the options' chunk size, and the rank
    /// from the options or the launcher.
    pub(super) fn new(targets: Vec<Target>, options: &PrefetchOptions, job: &Job<'_>) -> Plan {
        let lens: Vec<u64> = targets.iter().map(|t| t.len).collect();
        let requested = options.chunk_bytes().map_or(DEFAULT_CHUNK, |c| c as u64);
        Plan {
            chunks: ChunkPlan::new(&lens, requested, os::page_size()),
            rank: LocalRank::from_setting(job.local_rank, job.env),
            targets,
            checked: None,
        }
    }

    /// Residency of every chunk, then the memory guard within `available`
    /// bytes; checked once, and handed on to [`run`].
    pub(super) fn check(&mut self, available: Option<u64>) -> &Init {
        self.checked
            .get_or_insert_with(|| initial_states(&self.targets, &self.chunks.chunks, available))
    }

    /// A report of this plan before anything ran.
    pub(super) fn report(
        &self,
        streams: usize,
        method: PrefetchMethod,
        reason: PrefetchReason,
    ) -> PrefetchReport {
        // The report is the core's, `#[non_exhaustive]`: filled field by field.
        let mut report = PrefetchReport::default();
        report.reason = reason;
        report.rank = self.rank.rank;
        report.local_size = self.rank.size;
        report.rank_source = self.rank.source.clone();
        report.streams = streams;
        report.method = method;
        report.files = self.targets.len();
        report.total_bytes = self.chunks.total;
        report.chunk_size = self.chunks.chunk_size;
        report.chunks = self.chunks.chunks.len();
        report
    }
}

/// Warms the plan's files with `options.streams` readers, sharing the chunks
/// with the other local ranks where there are any.
pub(super) fn run(
    mut plan: Plan,
    options: &PrefetchOptions,
    job: &Job<'_>,
    reason: PrefetchReason,
) -> Result<PrefetchReport> {
    let clock = Instant::now();
    let methods: Vec<PrefetchMethod> = plan
        .targets
        .iter()
        .map(|t| resolve_method(options.warm_method(), t))
        .collect();
    let method = methods.first().copied().unwrap_or(PrefetchMethod::Pread);
    let mut report = plan.report(options.stream_count(), method, reason);
    if options.stream_count() == 0 {
        report.reason = PrefetchReason::Off;
        return Ok(report);
    }
    report.ran = true;
    let mut checked = plan.checked.take();
    let (targets, chunks) = (&plan.targets, &plan.chunks);
    let mut make = || {
        checked
            .take()
            .unwrap_or_else(|| initial_states(targets, &chunks.chunks, job.available()))
    };
    let run = Run {
        plan: &plan,
        methods: &methods,
        options,
        job,
    };
    let queue = run.open_queue(&mut make);
    let init = note_queue(&mut report, &queue, chunks.total);
    let outcome = run.read(&queue, init.needed)?;
    report.chunks_handled = outcome.handled;
    report.warmed = outcome.warmed;
    report.reread = outcome.reread;
    if let Some((bytes, why)) = outcome.stalled {
        report.skipped += bytes;
        report.skip_reasons.push(why);
    }
    report.resident_after = run.resident_after(&init, queue.is_shared(), outcome.handled);
    drop(queue);
    report.elapsed = clock.elapsed();
    Ok(report)
}

/// A run under way, as its steps share it: the files, how each is read,
/// their chunks and this rank (the plan), and the options and job it runs under.
struct Run<'a> {
    plan: &'a Plan,
    methods: &'a [PrefetchMethod],
    options: &'a PrefetchOptions,
    job: &'a Job<'a>,
}

impl Run<'_> {
    /// The queue, its chunk states from `make` where this rank creates it.
    fn open_queue(&self, make: &mut dyn FnMut() -> Init) -> Queue {
        // Its name and key cover the files, the chunk size and the job.
        let layout = Layout::of(&self.plan.chunks);
        if self.plan.rank.size > 1 && !self.options.shares_queue() {
            Queue::local(layout, make, Some(QueueNote::FixedShares))
        } else if self.plan.rank.size > 1 {
            let mut key_material = Vec::new();
            for t in &self.plan.targets {
                key_material.extend_from_slice(&t.identity);
            }
            key_material.extend_from_slice(&self.plan.chunks.chunk_size.to_le_bytes());
            let job_key = job_key(self.job.env.lookup(), os::parent_pid());
            key_material.extend_from_slice(job_key.as_bytes());
            let dir = self
                .options
                .queue_directory()
                .map_or_else(crate::coord::shared_dir, Path::to_path_buf);
            Queue::shared(&dir, &key_material, layout, Owner::current(), make)
        } else {
            Queue::local(layout, make, None)
        }
    }

    /// This rank's readers over the queue, counted on the caller's meter:
    /// `needed` bytes were not resident when the queue was made.
    fn read(&self, queue: &Queue, needed: u64) -> Result<Outcome> {
        let chunks = &self.plan.chunks.chunks;
        let (claimable, starts) = reader_plan(
            chunks,
            &self.plan.rank,
            self.options.stream_count(),
            queue.is_shared(),
        );
        // This rank's share is not known in advance (ranks take chunks from
        // each other): the total is every byte not yet resident.
        let meter = Meter::new(
            self.job.progress,
            Phase::Prefetch,
            needed,
            self.plan.targets.len(),
        );
        let work = Work {
            targets: &self.plan.targets,
            methods: self.methods,
            on_chunk: self.options.chunk_callback(),
            ..Work::over(queue, chunks, claimable, &meter, self.job.cancel)
        };
        let outcome = work.run(&starts)?;
        for _ in &self.plan.targets {
            meter.file_done();
        }
        meter.finish();
        Ok(outcome)
    }

    /// Bytes of the files resident once the readers are done: the check
    /// before, where nothing can have changed, else asked again.
    fn resident_after(&self, init: &Init, shared: bool, handled: usize) -> Option<u64> {
        if !shared && handled == 0 && init.known {
            // Nothing changed since the check a moment ago, in this process.
            Some(init.resident)
        } else {
            let mut scratch = Vec::new();
            self.plan
                .targets
                .iter()
                .map(|t| t.resident_total(self.plan.chunks.chunk_size, &mut scratch))
                .sum()
        }
    }
}

/// What the queue says before any read, into the report: its note and path,
/// and the residency and memory guard its header holds (returned).
fn note_queue(report: &mut PrefetchReport, queue: &Queue, total: u64) -> Init {
    report.queue_note = queue.note.clone();
    report.queue_path = queue.path.clone();
    report.shared_queue = report.queue_path.is_some();
    let init = init_from_header(queue.words());
    report.resident_before = init.resident;
    report.residency_known = init.known;
    report.skipped = init.skipped;
    report.skip_reasons.extend(init.guard_reason(total));
    init
}
