//! Strided matrix views and a checked wrapper around the `gemm` crate, shared by the kernels.

use super::float::Float;

/// A strided matrix view for [`gemm`]: element `(i, j)` is `data[i * rs + j * cs]`.
pub(crate) struct Mat<P> {
    ptr: P,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<P> Mat<P> {
    /// The view of `ptr`, a slice of `len` elements, checked to lie inside it.
    fn checked(ptr: P, len: usize, (rows, cols): (usize, usize), (rs, cs): (usize, usize)) -> Self {
        check_extent(len, rows, cols, rs, cs);
        Mat {
            ptr,
            rows,
            cols,
            rs,
            cs,
        }
    }
}

impl<'a, T> Mat<&'a [T]> {
    pub(crate) fn new(data: &'a [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Self::checked(data, data.len(), (rows, cols), (rs, cs))
    }

    /// The transposed view (no copy).
    pub(crate) fn t(self) -> Self {
        Mat {
            ptr: self.ptr,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }
}

impl<'a, T> Mat<&'a mut [T]> {
    pub(crate) fn new_mut(
        data: &'a mut [T],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> Self {
        let len = data.len();
        Self::checked(data, len, (rows, cols), (rs, cs))
    }
}

fn check_extent(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows > 0 && cols > 0 {
        assert!(
            (rows - 1) * rs + (cols - 1) * cs < len,
            "matrix view {rows}x{cols} (strides {rs}, {cs}) outside a slice of {len}"
        );
    }
}

/// `dst = [dst +] beta * lhs @ rhs` through the `gemm` crate, single-threaded: the kernels
/// run one gemm per thread themselves. The extents are checked when the views are built, and
/// `dst` is a `&mut` borrow, so it cannot overlap the inputs.
pub(crate) fn gemm<T: Float>(
    dst: Mat<&mut [T]>,
    accumulate: bool,
    lhs: Mat<&[T]>,
    rhs: Mat<&[T]>,
    beta: T,
) {
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    assert!(
        lhs.rows == m && rhs.rows == k && rhs.cols == n,
        "gemm shapes disagree: {m}x{n} = {}x{} @ {}x{}",
        lhs.rows,
        lhs.cols,
        rhs.rows,
        rhs.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            // An empty product is zero.
            for i in 0..m {
                for j in 0..n {
                    dst.ptr[i * dst.rs + j * dst.cs] = T::ZERO;
                }
            }
        }
        return;
    }
    // SAFETY: every element addressed by the sizes and strides lies inside the slices
    // (check_extent), dst is exclusively borrowed, and T is f32 or f64, which gemm supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            accumulate,
            lhs.ptr.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::ONE,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Rows of a row-major `x` per [`gemm`] call in products `x W^T` whose weight is read in
/// place (`W^T` row-major, `k x m`): the gemm crate copies ("packs") that weight into its
/// blocked layout whenever a single-threaded call has more than 8 x 6 rows on the other
/// side, and for the decoding step's few hundred rows that copy of the whole weight at every
/// step was about 11% of a beam search (profiled on a Zen 4). Calls of at most this many rows
/// stream the weight as it is, from cache after the first call.
pub(crate) const UNPACKED_ROWS: usize = 48;

/// `0..n` in near-equal consecutive ranges of at most [`UNPACKED_ROWS`].
pub(crate) fn unpacked_row_chunks(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let parts = n.div_ceil(UNPACKED_ROWS).max(1);
    (0..parts).map(move |i| i * n / parts..(i + 1) * n / parts)
}
