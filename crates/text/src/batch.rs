//! The tutorial's `batchify` and `get_batch`: one id stream laid out as `bsz` parallel columns,
//! read in windows of at most `bptt` rows. Rows are time and columns are batch (sequence-first,
//! like the tutorial and `nn.Transformer`'s default); a model that wants batch-first input
//! transposes the window.
//!
//! # Where the rules come from
//!
//! ```python
//! def batchify(data, bsz):
//!     seq_len = data.size(0) // bsz
//!     data = data[:seq_len * bsz]
//!     data = data.view(bsz, seq_len).t().contiguous()   # [seq_len, bsz]
//!     return data.to(device)
//!
//! def get_batch(source, i):
//!     seq_len = min(bptt, len(source) - 1 - i)
//!     data = source[i:i+seq_len]
//!     target = source[i+1:i+1+seq_len].reshape(-1)
//!     return data, target
//!
//! for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
//!     ...
//! num_batches = len(train_data) // bptt    # only used in the log line "| 200/2928 batches |"
//! ```
//!
//! So column `b` holds the `b`-th contiguous slice of the stream, element `[t][b]` is
//! `data[b * seq_len + t]`, the last `len % bsz` ids are dropped, and the target of every
//! position is the id below it in the same column. The loop visits the windows starting at
//! `0, bptt, 2 bptt, ... < rows - 1`; there are `ceil((rows - 1) / bptt)` of them
//! ([`Batched::num_windows`]), the last one possibly shorter. The tutorial's `num_batches`,
//! `rows / bptt` ([`Batched::tutorial_num_batches`]), only labels its log lines and is not
//! always the same number: on WikiText-2 train (102,499 rows, `bptt` 35) it prints 2928 while
//! the loop runs 2929 windows.

use crate::error::{Error, Result};

/// An id stream laid out in `cols` columns of `rows` consecutive ids each: row-major
/// `[rows, cols]`, so `data[t * cols + b]` is time step `t` of column `b`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batched {
    /// Time steps: `len / bsz` (the tutorial's `seq_len`).
    pub rows: usize,
    /// Parallel sequences: `bsz`.
    pub cols: usize,
    /// Row-major `[rows, cols]`.
    pub data: Vec<u32>,
}

/// One `get_batch` window: `input` rows `start..start + seq_len` and `target` rows
/// `start + 1..start + 1 + seq_len`, both row-major `[seq_len, batch_size]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// First row of `input` in the [`Batched`] grid.
    pub start: usize,
    /// Rows in this window: `min(bptt, rows - 1 - start)`.
    pub seq_len: usize,
    /// Columns: the [`Batched`] grid's `cols`.
    pub batch_size: usize,
    /// Row-major `[seq_len, batch_size]`.
    pub input: Vec<u32>,
    /// Row-major `[seq_len, batch_size]`, the ids one row further on (the tutorial's
    /// `target.reshape(-1)` is this flat vector).
    pub target: Vec<u32>,
}

/// The tutorial's `batchify(data, bsz)`: `data.len() / bsz` rows, the remainder dropped,
/// element `[t][b] = data[b * rows + t]`.
///
/// Errors if `bsz` is 0, or if there would be fewer than 2 rows (no window with a target).
///
/// ```
/// use transformer_text::batchify;
/// // The stream a..k (11 ids) in 2 columns: 5 rows, the 11th id dropped.
/// let grid = batchify(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 2)?;
/// assert_eq!((grid.rows, grid.cols), (5, 2));
/// assert_eq!(grid.data, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]);
/// # Ok::<(), transformer_text::Error>(())
/// ```
pub fn batchify(data: &[u32], bsz: usize) -> Result<Batched> {
    if bsz == 0 {
        return Err(Error::ZeroBatchSize);
    }
    let rows = data.len() / bsz;
    if rows < 2 {
        return Err(Error::TooFewTokens {
            tokens: data.len(),
            batch_size: bsz,
            needed: 2 * bsz,
        });
    }
    let mut grid = Vec::with_capacity(rows * bsz);
    for t in 0..rows {
        grid.extend((0..bsz).map(|b| data[b * rows + t]));
    }
    Ok(Batched {
        rows,
        cols: bsz,
        data: grid,
    })
}

/// The tutorial's `get_batch(source, i)`: the window of at most `bptt` rows starting at row
/// `i`, and its targets one row further on.
///
/// # Panics
/// If `bptt` is 0 or `i >= source.rows - 1` (no row left to be a target).
pub fn get_batch(source: &Batched, i: usize, bptt: usize) -> Batch {
    assert!(bptt > 0, "bptt must be at least 1");
    assert!(
        i + 1 < source.rows,
        "get_batch: window start {i} leaves no target row in a grid of {} rows",
        source.rows
    );
    let seq_len = bptt.min(source.rows - 1 - i);
    let cols = source.cols;
    Batch {
        start: i,
        seq_len,
        batch_size: cols,
        input: source.data[i * cols..(i + seq_len) * cols].to_vec(),
        target: source.data[(i + 1) * cols..(i + 1 + seq_len) * cols].to_vec(),
    }
}

impl Batched {
    /// Row `t`: the ids at time step `t` of every column.
    pub fn row(&self, t: usize) -> &[u32] {
        &self.data[t * self.cols..(t + 1) * self.cols]
    }

    /// The windows of the tutorial's loop, `get_batch(self, i, bptt)` for
    /// `i in range(0, rows - 1, bptt)`.
    ///
    /// # Panics
    /// If `bptt` is 0.
    pub fn windows(&self, bptt: usize) -> Windows<'_> {
        assert!(bptt > 0, "bptt must be at least 1");
        Windows {
            source: self,
            bptt,
            next: 0,
        }
    }

    /// Window `index` of [`windows`](Self::windows) (starting at row `index * bptt`).
    ///
    /// # Panics
    /// If `bptt` is 0 or the window is past the end.
    pub fn window(&self, index: usize, bptt: usize) -> Batch {
        assert!(
            index < self.num_windows(bptt),
            "window {index} of {}",
            self.num_windows(bptt)
        );
        get_batch(self, index * bptt, bptt)
    }

    /// How many windows [`windows`](Self::windows) yields: `len(range(0, rows - 1, bptt))`
    /// `= ceil((rows - 1) / bptt)`.
    ///
    /// # Panics
    /// If `bptt` is 0.
    pub fn num_windows(&self, bptt: usize) -> usize {
        assert!(bptt > 0, "bptt must be at least 1");
        (self.rows - 1).div_ceil(bptt)
    }

    /// The tutorial's `num_batches = len(train_data) // bptt`, printed in its log lines
    /// (`| 200/2928 batches |`). Not always [`num_windows`](Self::num_windows); see the module
    /// docs.
    ///
    /// # Panics
    /// If `bptt` is 0.
    pub fn tutorial_num_batches(&self, bptt: usize) -> usize {
        assert!(bptt > 0, "bptt must be at least 1");
        self.rows / bptt
    }
}

/// Iterator over the windows of a [`Batched`] grid; see [`Batched::windows`].
#[derive(Debug, Clone)]
pub struct Windows<'a> {
    source: &'a Batched,
    bptt: usize,
    next: usize,
}

impl Iterator for Windows<'_> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if self.next + 1 >= self.source.rows {
            return None;
        }
        let batch = get_batch(self.source, self.next, self.bptt);
        self.next += self.bptt;
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.source.rows - 1)
            .saturating_sub(self.next)
            .div_ceil(self.bptt);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Windows<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batchify_lays_out_columns_like_the_tutorial() {
        // The tutorial's own illustration: the alphabet in 4 columns, 6 rows, y and z dropped.
        let alphabet: Vec<u32> = (0..26).collect();
        let grid = batchify(&alphabet, 4).unwrap();
        assert_eq!((grid.rows, grid.cols), (6, 4));
        assert_eq!(grid.row(0), [0, 6, 12, 18]); // a g m s
        assert_eq!(grid.row(5), [5, 11, 17, 23]); // f l r x
        for t in 0..grid.rows {
            for b in 0..grid.cols {
                assert_eq!(grid.data[t * grid.cols + b], alphabet[b * grid.rows + t]);
            }
        }
        // One column is the stream itself, minus nothing.
        let one = batchify(&alphabet, 1).unwrap();
        assert_eq!((one.rows, one.cols), (26, 1));
        assert_eq!(one.data, alphabet);
    }

    #[test]
    fn batchify_needs_two_rows() {
        assert_eq!(batchify(&[1, 2, 3, 4], 2).unwrap().rows, 2);
        let err = batchify(&[1, 2, 3, 4, 5], 3).unwrap_err();
        assert!(matches!(
            err,
            Error::TooFewTokens {
                tokens: 5,
                batch_size: 3,
                needed: 6
            }
        ));
        assert_eq!(
            err.to_string(),
            "the split has 5 tokens, too few for batch size 3: batchify needs at least 6 \
             (2 rows of 3 columns) to form one input/target pair; use a smaller batch size or a \
             longer file"
        );
        assert!(matches!(batchify(&[], 1), Err(Error::TooFewTokens { .. })));
        assert!(matches!(batchify(&[1, 2], 0), Err(Error::ZeroBatchSize)));
    }

    #[test]
    fn get_batch_targets_are_one_row_later() {
        let stream: Vec<u32> = (0..26).collect();
        let grid = batchify(&stream, 4).unwrap(); // 6 rows
        let batch = get_batch(&grid, 0, 2);
        assert_eq!((batch.start, batch.seq_len, batch.batch_size), (0, 2, 4));
        assert_eq!(batch.input, [0, 6, 12, 18, 1, 7, 13, 19]);
        assert_eq!(batch.target, [1, 7, 13, 19, 2, 8, 14, 20]);
        // Near the end the window shrinks to the rows that still have a target.
        let last = get_batch(&grid, 4, 3);
        assert_eq!(last.seq_len, 1);
        assert_eq!(last.input, grid.row(4));
        assert_eq!(last.target, grid.row(5));
    }

    #[test]
    #[should_panic(expected = "window start 5 leaves no target row in a grid of 6 rows")]
    fn get_batch_past_the_last_target_panics() {
        let grid = batchify(&(0..24).collect::<Vec<u32>>(), 4).unwrap();
        get_batch(&grid, 5, 2);
    }

    #[test]
    fn windows_cover_every_position_once() {
        for (rows, bptt) in [
            (2, 1),
            (2, 5),
            (6, 2),
            (7, 2),
            (7, 3),
            (11, 35),
            (36, 35),
            (37, 35),
        ] {
            let stream: Vec<u32> = (0..(rows * 3) as u32).collect();
            let grid = batchify(&stream, 3).unwrap();
            assert_eq!(grid.rows, rows);
            let windows: Vec<Batch> = grid.windows(bptt).collect();
            assert_eq!(
                windows.len(),
                grid.num_windows(bptt),
                "rows {rows}, bptt {bptt}"
            );
            assert_eq!(grid.windows(bptt).len(), windows.len());
            assert_eq!(
                windows.len(),
                (0..rows - 1).step_by(bptt).count(),
                "range(0, rows - 1, bptt)"
            );
            // Inputs tile rows 0..rows-1 and targets rows 1..rows, in order.
            let inputs: Vec<u32> = windows.iter().flat_map(|w| w.input.clone()).collect();
            let targets: Vec<u32> = windows.iter().flat_map(|w| w.target.clone()).collect();
            assert_eq!(inputs, grid.data[..(rows - 1) * 3]);
            assert_eq!(targets, grid.data[3..]);
            for w in &windows {
                assert!(w.seq_len >= 1 && w.seq_len <= bptt);
            }
        }
    }

    #[test]
    fn tutorial_count_can_differ_from_the_loop() {
        let grid = Batched {
            rows: 102_499,
            cols: 1,
            data: vec![0; 102_499],
        };
        assert_eq!(grid.tutorial_num_batches(35), 2928);
        assert_eq!(grid.num_windows(35), 2929);
        let grid = Batched {
            rows: 36,
            cols: 1,
            data: vec![0; 36],
        };
        assert_eq!(
            (grid.tutorial_num_batches(35), grid.num_windows(35)),
            (1, 1)
        );
    }
}
