//! Per-tensor checksums of a set of weights, so that a weight publication can be verified end
//! to end: the learner digests what it sends, the engine digests what it received before
//! applying it, and what it serves after.
//!
//! A tensor's checksum is computed where the tensor lives (no copy to the host), on its bits:
//! the elements are reinterpreted as integers of their width, and the digest is their sum and
//! their sum weighted by position (modulo 2^64). Integer sums are exact and do not depend on
//! the order a device reduces in, so equal tensors always give equal digests, and any changed
//! element, a single flipped bit included, changes the plain sum; the weighted sum also
//! catches elements that moved.

use tch::{Kind, Tensor};

use crate::{Error, Result};

/// Positions weigh `1 + (i mod 65521)` in the weighted sum.
const POSITION_MODULUS: i64 = 65521;

/// Elements digested at a time.
const DIGEST_SLICE: i64 = 1 << 22;

/// The checksum of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDigest {
    /// Elements.
    pub numel: i64,
    /// Sum of the elements' bits as integers, wrapping.
    pub sum: i64,
    /// Sum of the bits weighted by position, wrapping.
    pub weighted: i64,
}

impl TensorDigest {
    /// The checksum of `t`'s values as stored (its kind and bits).
    pub fn of(t: &Tensor) -> Result<Self> {
        let bits_kind = match t.kind() {
            Kind::Float => Kind::Int,
            Kind::Double => Kind::Int64,
            Kind::BFloat16 | Kind::Half => Kind::Int16,
            other => {
                return Err(Error::invalid(
                    "weight digest",
                    format!("tensors of kind {other:?} are not weights (floating point expected)"),
                ))
            }
        };
        tch::no_grad(|| {
            let flat = t.detach().contiguous().view_dtype(bits_kind).flatten(0, -1);
            let n = flat.size()[0];
            // In slices: the int64 copies of a whole embedding (hundreds of millions of
            // elements) would be three times its size again. Sums modulo 2^64 are the same
            // in any grouping.
            let (mut sum, mut weighted) = (0i64, 0i64);
            let mut start = 0;
            while start < n {
                let len = DIGEST_SLICE.min(n - start);
                let bits = flat.narrow(0, start, len).to_kind(Kind::Int64);
                let position =
                    Tensor::arange_start(start, start + len, (Kind::Int64, bits.device()))
                        .remainder(POSITION_MODULUS)
                        + 1;
                sum = sum.wrapping_add(bits.sum(Kind::Int64).int64_value(&[]));
                weighted =
                    weighted.wrapping_add((&bits * position).sum(Kind::Int64).int64_value(&[]));
                start += len;
            }
            Ok(TensorDigest {
                numel: n,
                sum,
                weighted,
            })
        })
    }
}

/// Checksums of named tensors, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightDigest(pub Vec<(String, TensorDigest)>);

impl WeightDigest {
    /// Digests `tensors` where they live.
    pub fn of(tensors: &[(String, Tensor)]) -> Result<Self> {
        tensors
            .iter()
            .map(|(name, t)| Ok((name.clone(), TensorDigest::of(t)?)))
            .collect::<Result<Vec<_>>>()
            .map(WeightDigest)
    }

    /// The first tensor whose checksum differs from `other`'s (or that only one of them has),
    /// as a [`Error::WeightSyncMismatch`] naming it and `stage`.
    pub fn verify(&self, other: &WeightDigest, stage: &str) -> Result<()> {
        if self.0.len() != other.0.len() {
            return Err(Error::WeightSyncMismatch {
                stage: stage.into(),
                tensor: "(the set of tensors)".into(),
                detail: format!("{} tensors expected, {} found", self.0.len(), other.0.len()),
            });
        }
        for ((name, expected), (other_name, got)) in self.0.iter().zip(&other.0) {
            if name != other_name {
                return Err(Error::WeightSyncMismatch {
                    stage: stage.into(),
                    tensor: name.clone(),
                    detail: format!("found `{other_name}` in its place"),
                });
            }
            if expected != got {
                return Err(Error::WeightSyncMismatch {
                    stage: stage.into(),
                    tensor: name.clone(),
                    detail: format!("checksum {expected:?} expected, {got:?} found"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tensors_agree_and_any_changed_bit_or_moved_element_is_caught() {
        let t = Tensor::randn([64, 33], (Kind::Float, tch::Device::Cpu));
        let named = vec![("w".to_string(), t.copy())];
        let digest = WeightDigest::of(&named).unwrap();
        assert_eq!(digest, WeightDigest::of(&[("w".into(), t.copy())]).unwrap());

        // The lowest mantissa bit of one element.
        let flipped = t.copy();
        let bits = flipped.view_dtype(Kind::Int);
        let _ = bits.get(3).get(5).g_add_scalar_(1);
        let err = digest
            .verify(&WeightDigest::of(&[("w".into(), flipped)]).unwrap(), "test")
            .unwrap_err();
        assert!(err.to_string().contains("`w`"), "{err}");

        // Two elements swapped: the plain sum is the same, the weighted sum is not.
        let swapped = t.copy();
        let (a, b) = (t.get(0).get(0), t.get(0).get(1));
        swapped.get(0).get(0).copy_(&b);
        swapped.get(0).get(1).copy_(&a);
        let moved = TensorDigest::of(&swapped).unwrap();
        let original = TensorDigest::of(&t).unwrap();
        assert_eq!(moved.sum, original.sum);
        assert_ne!(moved.weighted, original.weighted);

        // bf16 tensors digest their own bits.
        let half = t.to_kind(Kind::BFloat16);
        assert_eq!(
            TensorDigest::of(&half).unwrap(),
            TensorDigest::of(&half.copy()).unwrap()
        );
        assert!(TensorDigest::of(&Tensor::from_slice(&[1i64, 2])).is_err());
    }

    #[test]
    fn a_tensor_digested_in_slices_has_the_digest_of_the_whole() {
        // Over two slices and a part; the whole computed at once, as the definition reads.
        let n = 2 * DIGEST_SLICE + 12_345;
        let t = Tensor::randn([n], (Kind::Float, tch::Device::Cpu)) * 1e3;
        let bits = t.view_dtype(Kind::Int).to_kind(Kind::Int64);
        let position =
            Tensor::arange(n, (Kind::Int64, tch::Device::Cpu)).remainder(POSITION_MODULUS) + 1;
        let whole = TensorDigest {
            numel: n,
            sum: bits.sum(Kind::Int64).int64_value(&[]),
            weighted: (&bits * position).sum(Kind::Int64).int64_value(&[]),
        };
        assert_eq!(TensorDigest::of(&t).unwrap(), whole);
    }
}
