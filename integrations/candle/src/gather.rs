//! [`gather_rows`]: a batch's distinct rows copied back to its ids'
//! positions, as one candle op with a backward made for it.
//!
//! candle's `index_select` gives the same forward, but on the CPU its
//! backward is an `index_add` on one thread into a copy of a zeroed
//! gradient, and a reshape of its output to the ids' shape adds a second
//! node whose backward is a zeroed gradient and an add as large as the
//! output. [`gather_rows`] makes the ids' shape in the op itself (no
//! reshape node) and its backward sums each position's gradient row into
//! its distinct row directly:
//!
//! - **same bits as `index_select`**: the forward copies rows; the
//!   backward adds each distinct row's gradient rows in position order,
//!   starting from zero, the order `index_add` adds them in, so the
//!   gradient is the same `f32`s (the parity tests against
//!   `candle_nn::Embedding` hold to the bit for SGD);
//! - **threads**: on a batch of at least [`MIN_VALUES_PER_CHUNK`] values
//!   per thread, the forward's copy is split by positions and the
//!   backward's sums by distinct rows (each thread scans the positions
//!   and adds those of its own rows, still in position order) over
//!   candle's CPU threads ([`crate::threads`]);
//! - **devices**: the op runs on the CPU; on another device
//!   [`gather_rows`] is candle's `index_select` and `reshape`;
//! - **checked**: a position naming no row, rows that are not a matrix of
//!   `f32` or a shape that is not the positions' rows is an error, not a
//!   panic.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};

use crate::rows::{with_f32_values, zeroed};
use crate::{threads, Error, Result};

/// Fewest values a thread is handed: below two chunks of this the op runs
/// on the caller's thread alone.
pub const MIN_VALUES_PER_CHUNK: usize = 1 << 16;

/// Items per chunk when `items` items of `width` values each are split
/// over `threads` threads, or `None` to stay on one thread.
fn chunk_len(items: usize, width: usize, threads: usize) -> Option<usize> {
    let values = items.saturating_mul(width);
    let chunks = threads.min(values / MIN_VALUES_PER_CHUNK);
    (chunks >= 2).then(|| items.div_ceil(chunks))
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
    let expected = positions.len().checked_mul(dim);
    if expected != Some(shape.elem_count()) {
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
    let copy = |positions: &[u32], out: &mut [f32]| {
        for (&row, out) in positions.iter().zip(out.chunks_exact_mut(dim)) {
            let at = row as usize * dim;
            out.copy_from_slice(&rows[at..at + dim]);
        }
    };
    match chunk_len(positions.len(), dim, threads) {
        Some(chunk) => {
            threads::run_chunks_mut(&mut out, chunk * dim, |part, out| {
                let first = part * chunk;
                copy(&positions[first..(first + chunk).min(positions.len())], out)
            });
        }
        None => copy(positions, &mut out),
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
    if grad.len() != positions.len() * dim {
        return Err(Error::invalid(format!(
            "a gradient of {} values for {} positions of {dim}",
            grad.len(),
            positions.len()
        )));
    }
    let mut sums = zeroed(rows, dim)?;
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
    match chunk_len(rows, dim, threads).filter(|_| positions.len() >= rows) {
        Some(chunk) => {
            threads::run_chunks_mut(&mut sums, chunk * dim, |part, sums| add(part * chunk, sums));
        }
        None => add(0, &mut sums),
    }
    Ok(sums)
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
            assert!(chunk_len(positions.len(), dim, threads).is_some(), "split");
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
    }
}
