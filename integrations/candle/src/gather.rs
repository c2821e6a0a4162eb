//! [`gather_rows`]: a batch's distinct rows copied back to its ids'
//! positions, as one candle op with a backward made for it.
//!
//! candle's `index_select` gives the same forward, but on the CPU its
//! backward is an `index_add` on one thread, and a reshape of its output
//! to the ids' shape adds a second graph node whose backward is a zeroed
//! gradient and an add as large as the output. [`gather_rows`] makes the
//! output's shape in the op itself (no reshape node), and its backward
//! sums each position's gradient row into its distinct row, split over
//! threads; candle then adds that block into the rows' gradient as it
//! does for any op:
//!
//! - **`index_select`'s values**: the forward copies rows; the backward
//!   adds each distinct row's gradient rows in position order, starting
//!   from zero, the order `index_add` adds them in. When the gather is the
//!   rows' only use in the loss (no regularizer on them, say), the
//!   gradient is the same bits as `index_select`'s (the parity tests
//!   against `candle_nn::Embedding` hold to the bit for SGD); when the rows
//!   also get a gradient from elsewhere, the sum is added as one block, so
//!   it can round differently from `index_add`'s position-by-position
//!   adds into it (a last bit).
//! - **threads**: when the output holds at least two chunks of
//!   [`MIN_VALUES_PER_CHUNK`] values, the forward's copy is split by
//!   positions over candle's CPU threads (`threads.rs`); the backward
//!   splits the distinct rows into ranges holding about equal numbers of
//!   positions (ids are numbered by first appearance, so frequent ids
//!   crowd the first rows), each thread scanning the positions and adding
//!   those of its own rows, still in position order;
//! - **devices**: the op runs on the CPU; on another device
//!   [`gather_rows`] is candle's `index_select` and `reshape`;
//! - **first order**: the backward is computed outside the graph, so
//!   there is no second-order gradient through it (candle's default; with
//!   `CANDLE_GRAD_DO_NOT_DETACH` set, `index_select` would have one);
//! - **checked**: a position naming no row, rows that are not a matrix of
//!   `f32`, or a shape whose element count overflows or is not the
//!   positions' rows is an error, not a panic; rows of no values give an
//!   empty output.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

use crate::rows::{filled, with_f32_values, zeroed};
use crate::{threads, Error, Result};

/// Fewest values a thread is handed: below two chunks of this the op runs
/// on the caller's thread alone.
pub const MIN_VALUES_PER_CHUNK: usize = 1 << 16;

/// How many parts `items` items of `width` values each are split into
/// for `threads` threads (1: no split).
fn parts_for(items: usize, width: usize, threads: usize) -> usize {
    let values = items.saturating_mul(width);
    threads.min(values / MIN_VALUES_PER_CHUNK).max(1)
}

/// Rows `[n, dim]` gathered to `positions`: position `p` of the output
/// holds row `positions[p]`, in a tensor of shape `shape` (whose elements
/// are `positions.len() * dim`, e.g. the ids' shape followed by `dim`).
/// Differentiable in `rows`; see the [module docs](self).
pub fn gather_rows(rows: &Tensor, positions: Vec<u32>, shape: impl Into<Shape>) -> Result<Tensor> {
    let shape = shape.into();
    let (n, dim) = rows.dims2().map_err(|_| {
        Error::invalid(format!(
            "gathered rows must be a matrix, not of shape {:?}",
            rows.dims()
        ))
    })?;
    let elements = shape
        .dims()
        .iter()
        .try_fold(1_usize, |count, &d| count.checked_mul(d));
    if elements.is_none() || positions.len().checked_mul(dim) != elements {
        return Err(Error::invalid(format!(
            "{} positions of {dim} values do not fill shape {shape:?}",
            positions.len()
        )));
    }
    if let Some(p) = positions.iter().position(|&row| row as usize >= n) {
        return Err(Error::invalid(format!(
            "position {p} names row {} of {n}",
            positions[p]
        )));
    }
    if rows.dtype() != DType::F32 {
        return Err(Error::invalid(format!(
            "gathered rows must be f32, not {:?}",
            rows.dtype()
        )));
    }
    if !matches!(rows.device(), Device::Cpu) {
        let len = positions.len();
        let index = Tensor::from_vec(positions, len, rows.device())?;
        return Ok(rows.index_select(&index, 0)?.reshape(shape)?);
    }
    let op = GatherRows { positions, shape };
    Ok(rows.contiguous()?.apply_op1(op)?)
}

/// The op behind [`gather_rows`] (checked there).
struct GatherRows {
    positions: Vec<u32>,
    shape: Shape,
}

impl CustomOp1 for GatherRows {
    fn name(&self) -> &'static str {
        "dynemb-gather-rows"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(values), Some((start, end))) = (storage, layout.contiguous_offsets())
        else {
            candle_core::bail!("dynemb-gather-rows: rows must be contiguous f32");
        };
        let dim = layout.dims()[1];
        let out = gather(&values[start..end], &self.positions, dim, threads::count())
            .map_err(candle_error)?;
        Ok((CpuStorage::F32(out), self.shape.clone()))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let (rows, dim) = arg.dims2()?;
        let sums = with_f32_values(grad, |grad| {
            scatter_add(grad, &self.positions, rows, dim, threads::count())
        })
        .map_err(candle_error)?;
        Ok(Some(Tensor::from_vec(sums, (rows, dim), arg.device())?))
    }
}

fn candle_error(e: Error) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// The output's values: row `positions[p]` of `rows` at position `p`,
/// split for `threads` threads.
fn gather(rows: &[f32], positions: &[u32], dim: usize, threads: usize) -> Result<Vec<f32>> {
    let mut out = zeroed(positions.len(), dim)?;
    if dim == 0 {
        return Ok(out);
    }
    let copy = |positions: &[u32], out: &mut [f32]| {
        for (&row, out) in positions.iter().zip(out.chunks_exact_mut(dim)) {
            let at = row as usize * dim;
            out.copy_from_slice(&rows[at..at + dim]);
        }
    };
    let parts = parts_for(positions.len(), dim, threads);
    if parts == 1 {
        copy(positions, &mut out);
    } else {
        let chunk = positions.len().div_ceil(parts);
        threads::run_chunks_mut(&mut out, chunk * dim, |part, out| {
            let first = part * chunk;
            copy(&positions[first..(first + chunk).min(positions.len())], out)
        });
    }
    Ok(out)
}

/// The gradient of the rows: the sum over positions `p` of `grad`'s row
/// `p` into row `positions[p]`, added in position order, split for
/// `threads` threads.
fn scatter_add(
    grad: &[f32],
    positions: &[u32],
    rows: usize,
    dim: usize,
    threads: usize,
) -> Result<Vec<f32>> {
    if positions.len().checked_mul(dim) != Some(grad.len()) {
        return Err(Error::invalid(format!(
            "a gradient of {} values for {} positions of {dim}",
            grad.len(),
            positions.len()
        )));
    }
    let mut sums = zeroed(rows, dim)?;
    if dim == 0 {
        return Ok(sums);
    }
    // Adds the positions' gradient rows that fall in `first..` of `sums`.
    let add = |first: usize, sums: &mut [f32]| {
        let end = first + sums.len() / dim;
        for (&row, grad) in positions.iter().zip(grad.chunks_exact(dim)) {
            let row = row as usize;
            if (first..end).contains(&row) {
                let at = (row - first) * dim;
                for (sum, g) in sums[at..at + dim].iter_mut().zip(grad) {
                    *sum += g;
                }
            }
        }
    };
    let parts = parts_for(positions.len(), dim, threads);
    if parts == 1 {
        add(0, &mut sums);
        return Ok(sums);
    }
    let bounds = balanced_bounds(positions, rows, parts)?;
    let mut ranges = Vec::with_capacity(parts);
    let mut rest = sums.as_mut_slice();
    for pair in bounds.windows(2) {
        let (range, tail) = rest.split_at_mut((pair[1] - pair[0]) * dim);
        ranges.push(range);
        rest = tail;
    }
    threads::run_each(ranges, |part, sums| add(bounds[part], sums));
    Ok(sums)
}

/// `parts + 1` row bounds `0 = b0 <= b1 <= .. <= b_parts = rows` cutting
/// the rows into ranges that `positions` name about equally often.
fn balanced_bounds(positions: &[u32], rows: usize, parts: usize) -> Result<Vec<usize>> {
    let mut counts = filled(rows, 0_usize, "position counts")?;
    for &row in positions {
        counts[row as usize] += 1;
    }
    let mut bounds = Vec::with_capacity(parts + 1);
    bounds.push(0);
    let (mut row, mut seen) = (0, 0);
    for part in 1..parts {
        let target = positions.len() * part / parts;
        while row < rows && seen < target {
            seen += counts[row];
            row += 1;
        }
        bounds.push(row);
    }
    bounds.push(rows);
    Ok(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// Rows, positions and an upstream gradient big enough to be split.
    fn case(rows: usize, dim: usize, positions: usize) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
        let values = (0..rows * dim).map(|i| (i as f32).sin()).collect();
        let positions: Vec<u32> = (0..positions).map(|p| ((p * 7919) % rows) as u32).collect();
        let grad = (0..positions.len() * dim)
            .map(|i| ((i * 31 % 997) as f32 - 498.0) * 1e-3)
            .collect();
        (values, positions, grad)
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|x| x.to_bits()).collect()
    }

    /// The forward and the rows' gradient (of `sum(output * upstream)`)
    /// through `gather_rows` and through candle's index_select + reshape.
    fn both(rows: usize, dim: usize, n: usize) -> [(Vec<f32>, Vec<f32>); 2] {
        let (values, positions, upstream) = case(rows, dim, n);
        let shape = (n / 2, 2, dim);
        let run = |ours: bool| {
            let var = Var::from_vec(values.clone(), (rows, dim), &Device::Cpu).unwrap();
            let out = if ours {
                gather_rows(var.as_tensor(), positions.clone(), shape).unwrap()
            } else {
                let index = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
                var.index_select(&index, 0).unwrap().reshape(shape).unwrap()
            };
            let up = Tensor::from_vec(upstream.clone(), shape, &Device::Cpu).unwrap();
            let grads = (out.clone() * up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (flat(&out), flat(grads.get(var.as_tensor()).unwrap()))
        };
        [run(true), run(false)]
    }

    #[test]
    fn forward_and_gradient_are_index_selects_bits() {
        for (rows, n) in [(5, 12), (3000, 40_000)] {
            let [ours, candle] = both(rows, 16, n);
            assert_eq!(ours.0, candle.0, "forward, {n} positions");
            assert_eq!(bits(&ours.1), bits(&candle.1), "gradient, {n} positions");
        }
    }

    #[test]
    fn split_work_equals_one_thread() {
        let (rows, dim) = (3000, 16);
        let (values, positions, grad) = case(rows, dim, 40_000);
        let one = gather(&values, &positions, dim, 1).unwrap();
        let sums = scatter_add(&grad, &positions, rows, dim, 1).unwrap();
        for threads in [2, 3, 5] {
            assert_eq!(parts_for(positions.len(), dim, threads), threads, "split");
            assert_eq!(gather(&values, &positions, dim, threads).unwrap(), one);
            let split = scatter_add(&grad, &positions, rows, dim, threads).unwrap();
            assert_eq!(bits(&split), bits(&sums), "{threads} threads");
        }
        assert!(scatter_add(&grad[1..], &positions, rows, dim, 2).is_err());
    }

    #[test]
    fn bad_input_is_an_error() {
        let rows = Tensor::zeros((3, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(
            gather_rows(&rows, vec![0, 3], (2, 2)).is_err(),
            "row out of range"
        );
        assert!(
            gather_rows(&rows, vec![0, 1], (3, 2)).is_err(),
            "shape too large"
        );
        let flat = Tensor::zeros(6, DType::F32, &Device::Cpu).unwrap();
        assert!(gather_rows(&flat, vec![0], (1, 2)).is_err(), "not a matrix");
        let ints = Tensor::zeros((3, 2), DType::U32, &Device::Cpu).unwrap();
        assert!(gather_rows(&ints, vec![0], (1, 2)).is_err(), "not f32");
        assert_eq!(gather_rows(&rows, vec![], (0, 2)).unwrap().dims(), [0, 2]);
        assert!(
            gather_rows(&rows, vec![], (1_usize << 63, 2)).is_err(),
            "element count overflows"
        );
        let no_values = Var::zeros((3, 0), DType::F32, &Device::Cpu).unwrap();
        let out = gather_rows(no_values.as_tensor(), vec![0, 2], (2, 0)).unwrap();
        assert_eq!(out.dims(), [2, 0]);
        let grads = out.sum_all().unwrap().backward().unwrap();
        assert_eq!(grads.get(no_values.as_tensor()).unwrap().dims(), [3, 0]);
        assert_eq!(
            gather_rows(no_values.as_tensor(), vec![], (0, 0))
                .unwrap()
                .dims(),
            [0, 0]
        );
    }

    #[test]
    fn bounds_balance_positions_over_skewed_rows() {
        // Row 0 is named 900 times, rows 1..=100 once each.
        let mut positions = vec![0_u32; 900];
        positions.extend(1..=100);
        assert_eq!(balanced_bounds(&positions, 101, 2).unwrap(), [0, 1, 101]);
        let even: Vec<u32> = (0..100).collect();
        assert_eq!(
            balanced_bounds(&even, 100, 4).unwrap(),
            [0, 25, 50, 75, 100]
        );
        assert_eq!(balanced_bounds(&[], 7, 3).unwrap(), [0, 0, 0, 7]);
    }
}
