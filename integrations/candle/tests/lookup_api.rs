//! The lookup family's calls in their documented form (the contract), and the
//! forms around them: ids of any rank and key type, both sparse forms.

use candle_core::{Device, Tensor};
use dynemb::{Initializer, Variable};
use dynemb_candle::{
    embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse,
    safe_embedding_lookup_sparse_with_max_norm, Combiner, Ids, Result, SparseIds,
};

fn table() -> Variable<i64> {
    let var = Variable::<i64>::builder("api")
        .dim(2)
        .initializer(Initializer::Constant(0.5))
        .build()
        .unwrap();
    var.upsert(&[7, 9, 3, 0], &[3.0, 4.0, 1.0, 0.0, 0.0, 2.0, -1.0, 1.0])
        .unwrap();
    var
}

/// `t` holds `want`, NaN where `want` is NaN.
fn assert_values(t: &Tensor, want: &[f32]) {
    let got = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let same = |(g, w): (&f32, &f32)| g == w || (g.is_nan() && w.is_nan());
    assert!(
        got.len() == want.len() && got.iter().zip(want).all(same),
        "{got:?} != {want:?}"
    );
}

#[test]
fn api_md_contract_calls() -> Result<()> {
    let var = table();
    let sp = SparseIds::from_coo(&[[0, 0], [0, 1], [2, 0]], &[7_i64, 9, 3], [3, 2])?;
    let bags = SparseIds::from_offsets(&[7_i64, 9, 3], &[0, 2, 2, 3])?;
    assert_eq!(sp.rows(), bags.rows());
    let weights = vec![1.0_f32, 3.0, 2.0];

    let t = embedding_lookup(&var, &[7_i64, 42], Some(2.0))?;
    assert_eq!(t.dims(), [2, 2]);
    assert_values(&t, &[1.2, 1.6, 0.5, 0.5]);

    // Row 0: (3, 4) * 1 + (1, 0) * 3 over 1 + 3; row 1 is empty, and
    // weighted mean makes it 0/0 as TFRA does; row 2: (0, 2) * 2 / 2.
    let t = embedding_lookup_sparse(&var, &sp, Some(&weights), Combiner::Mean)?;
    assert_eq!(t.dims(), [3, 2]);
    assert_values(&t, &[1.5, 1.0, f32::NAN, f32::NAN, 0.0, 2.0]);

    // Row 1 is empty: the default id 0's row.
    let t = safe_embedding_lookup_sparse(&var, &sp, None, Combiner::Sqrtn, Some(0_i64))?;
    let s = 1.0 / 2.0_f64.sqrt() as f32;
    assert_values(&t, &[(3.0 + 1.0) * s, 4.0 * s, -1.0, 1.0, 0.0, 2.0]);
    let from_bags = safe_embedding_lookup_sparse(&var, &bags, None, Combiner::Sqrtn, Some(0))?;
    assert_values(&from_bags, &t.flatten_all()?.to_vec1::<f32>()?);

    assert_eq!(var.size(), 4, "lookups never insert");
    Ok(())
}

#[test]
fn ids_of_any_rank_from_slices_vectors_and_tensors() -> Result<()> {
    let var = table();
    let t = embedding_lookup(&var, Ids::new(vec![7_i64], &[])?, None)?;
    assert_eq!(t.dims(), [2]);
    let ids = Tensor::new(&[[7_i64, 9, 7], [1, 3, 9]], &Device::Cpu)?;
    let t = embedding_lookup(&var, Ids::from_tensor(&ids)?, None)?;
    assert_eq!(t.dims(), [2, 3, 2]);
    assert_values(
        &t,
        &[3.0, 4.0, 1.0, 0.0, 3.0, 4.0, 0.5, 0.5, 0.0, 2.0, 1.0, 0.0],
    );
    let t = embedding_lookup(&var, vec![3_i64, 3], None)?;
    assert_values(&t, &[0.0, 2.0, 0.0, 2.0]);
    let empty: &[i64] = &[];
    assert_eq!(embedding_lookup(&var, empty, Some(1.0))?.dims(), [0, 2]);
    assert_eq!(
        embedding_lookup(&var, Ids::new(vec![], &[2, 0])?, None)?.dims(),
        [2, 0, 2]
    );
    Ok(())
}

#[test]
fn every_key_type() -> Result<()> {
    let var = Variable::<u64>::builder("u64").dim(1).build()?;
    var.upsert(&[u64::MAX, 0], &[2.0, -1.0])?;
    let t = embedding_lookup(&var, &[u64::MAX, 5, 0], None)?;
    assert_values(&t, &[2.0, 0.0, -1.0]);
    let var = Variable::<u32>::builder("u32").dim(1).build()?;
    var.upsert(&[4], &[3.0])?;
    let sp = SparseIds::from_offsets(&[4_u32, 4, 1], &[0, 3])?;
    let t = embedding_lookup_sparse(&var, &sp, None, Combiner::Sum)?;
    assert_values(&t, &[6.0]);
    let var = Variable::<i32>::builder("i32").dim(1).build()?;
    var.upsert(&[-4], &[3.0])?;
    let sp = SparseIds::from_offsets(&[-4_i32], &[0, 0, 1])?;
    let t = safe_embedding_lookup_sparse_with_max_norm(
        &var,
        &sp,
        None,
        Combiner::Mean,
        None,
        Some(1.0),
    )?;
    assert_values(&t, &[0.0, 1.0]);
    Ok(())
}

#[test]
fn rank_one_and_rank_three_sparse_ids() -> Result<()> {
    let var = table();
    // Rank 1: one row holding everything, output [dim].
    let sp = SparseIds::from_coo_nd(&[1, 3], &[7_i64, 9], &[5])?;
    let t = safe_embedding_lookup_sparse(&var, &sp, None, Combiner::Sum, None)?;
    assert_eq!(t.dims(), [2]);
    assert_values(&t, &[4.0, 4.0]);
    // ... but for embedding_lookup_sparse each position is its own segment.
    let t = embedding_lookup_sparse(&var, &sp, None, Combiner::Sum)?;
    assert_values(&t, &[0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 0.0]);
    // Rank 3: rows over the first two dimensions; segments the first only.
    let sp = SparseIds::from_coo_nd(&[0, 1, 0, 1, 0, 2], &[7_i64, 9], &[2, 2, 3])?;
    let t = safe_embedding_lookup_sparse(&var, &sp, None, Combiner::Sum, None)?;
    assert_eq!(t.dims(), [2, 2, 2]);
    assert_values(&t, &[0.0, 0.0, 3.0, 4.0, 1.0, 0.0, 0.0, 0.0]);
    let t = embedding_lookup_sparse(&var, &sp, None, Combiner::Sum)?;
    assert_values(&t, &[3.0, 4.0, 1.0, 0.0]);
    Ok(())
}
