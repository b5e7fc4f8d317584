//! The choice between ordinary and streaming stores into the areas, per size class, by timing
//! whole calls on rank 0 (`StoreTuner`).

use std::time::{Duration, Instant};

/// What rank 0 notes about a call to time it.
pub(super) struct Timing {
    pub(super) class: usize,
    pub(super) bytes: usize,
    pub(super) streaming: bool,
    pub(super) start: Instant,
}

/// Chooses, per size class (powers of two), between ordinary and streaming stores into the
/// areas, by timing whole calls on rank 0. Which is faster depends on where the ranks run, and
/// that changes under a job's feet: when every reader shares a cache with the writer,
/// ordinary stores keep the data in that cache (measured: 2 ranks, 4 MiB, 336 µs against
/// about 650); when readers sit on another core complex, each ordinary store to a line they
/// hold waits for a round trip, and streaming stores are 3.4× faster (2192 µs against 646),
/// while with 4 ranks on 2 cores half the readers share the writer's core and ordinary stores
/// win again (1256 µs against 1700). Rank 0 publishes its choice with each call, for the
/// next; every choice gives the same results, so a rank that sees it late only loses time.
pub(super) struct StoreTuner {
    /// Per class, per kind (ordinary, streaming): smoothed nanoseconds per byte and samples.
    stats: [[(f64, u32); 2]; CLASSES],
    /// Calls timed per class, to explore the other kind now and then.
    calls: [u32; CLASSES],
    /// Bit `k`: streaming stores for class `k` (updated with every sample).
    pub(super) hints: u64,
}

const CLASSES: usize = 64;
/// Calls moving less than this are not tuned: their stores are too few to matter.
const TUNED_FROM: usize = 4096;
/// One call in this many tries the kind that is currently slower, to notice a change.
const EXPLORE_EVERY: u32 = 16;

impl StoreTuner {
    pub(super) fn new() -> StoreTuner {
        StoreTuner {
            stats: [[(0.0, 0); 2]; CLASSES],
            calls: [0; CLASSES],
            hints: 0,
        }
    }

    pub(super) fn class(bytes: usize) -> Option<usize> {
        (bytes >= TUNED_FROM).then(|| bytes.ilog2() as usize)
    }

    pub(super) fn streams(&self, k: usize) -> bool {
        let [(plain, plain_n), (stream, stream_n)] = self.stats[k];
        if plain_n < 2 || stream_n < 2 {
            return stream_n < plain_n;
        }
        let faster = stream < plain;
        faster != (self.calls[k] % EXPLORE_EVERY == EXPLORE_EVERY - 1)
    }

    /// Notes that a call of `class` moving `bytes` took `elapsed` with these stores.
    pub(super) fn record(
        &mut self,
        class: usize,
        streaming: bool,
        bytes: usize,
        elapsed: Duration,
    ) {
        let per_byte = elapsed.as_nanos() as f64 / bytes as f64;
        let (avg, n) = &mut self.stats[class][usize::from(streaming)];
        *avg = if *n == 0 {
            per_byte
        } else {
            0.75 * *avg + 0.25 * per_byte
        };
        *n = n.saturating_add(1);
        self.calls[class] = self.calls[class].wrapping_add(1);
        let bit = 1 << class;
        self.hints = if self.streams(class) {
            self.hints | bit
        } else {
            self.hints & !bit
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays calls of one class against the tuner, timed as `cost` says for each kind.
    fn play(tuner: &mut StoreTuner, calls: usize, cost: impl Fn(bool) -> u64) -> Vec<bool> {
        let class = StoreTuner::class(1 << 20).unwrap();
        (0..calls)
            .map(|_| {
                let streaming = tuner.hints & (1 << class) != 0;
                let took = Duration::from_micros(cost(streaming));
                tuner.record(class, streaming, 1 << 20, took);
                streaming
            })
            .collect()
    }

    #[test]
    fn the_tuner_keeps_the_faster_stores_and_notices_a_change() {
        let mut tuner = StoreTuner::new();
        // Streaming is 3× faster: after trying both, it streams, except to explore.
        let used = play(&mut tuner, 64, |s| if s { 100 } else { 300 });
        assert!(
            used[..4].contains(&true) && used[..4].contains(&false),
            "{used:?}"
        );
        let later = &used[8..];
        let plain = later.iter().filter(|s| !**s).count();
        assert!(plain >= 2 && plain <= later.len() / 8, "{used:?}");
        // The placement changes: ordinary stores become faster, and the tuner follows.
        let used = play(&mut tuner, 96, |s| if s { 300 } else { 100 });
        assert!(used[48..].iter().filter(|s| **s).count() <= 3, "{used:?}");
        // Small calls are never tuned.
        assert_eq!(StoreTuner::class(TUNED_FROM - 1), None);
    }
}
