//! AdamW over an explicit list of parameters, with linear warm-up, a gradient-norm check and
//! state that can be saved and restored.
//!
//! Mixed precision: a parameter stored in bfloat16 (or float16) gets a float32 master copy,
//! and its moments are float32. The step updates the master and rounds it into the parameter.
//! Without the master, a step of lr 1e-6 on a weight of 0.02 is far below bfloat16's spacing
//! there (about 1e-4) and rounds away: the model would silently not learn.
//!
//! tch's `nn::Optimizer` always takes a whole `VarStore`; the learner needs two optimizers over
//! one store when the value head shares the policy's trunk (the head at the critic's learning
//! rate, the rest at the actor's), and it needs the gradient norm *before* clipping to refuse
//! non-finite gradients, which `clip_grad_norm` neither returns nor checks. The update itself
//! is written out here (torch's `AdamW` step, op for op) because libtorch's C++ optimizer
//! behind tch's `COptimizer` does not expose its moments: a checkpoint without them restarts
//! Adam from zero, and the first steps after a resume then differ from the uninterrupted run.

use std::path::Path;

use tch::Tensor;

use crate::process_group::ProcessGroup;
use crate::{Error, Result};

/// AdamW's `eps`, as torch's default.
const EPS: f64 = 1e-8;

/// Elements per slice of a large parameter when the gradient norm is summed (in float64)
/// and when AdamW steps it: the temporaries stay this small.
const NORM_SLICE: i64 = 1 << 22;

/// One AdamW optimizer and its schedule.
#[derive(Debug)]
pub(crate) struct ParamOptimizer {
    params: Vec<Tensor>,
    /// Float32 copies of the parameters stored in lower precision (`None` for float32 ones,
    /// which are updated in place).
    masters: Vec<Option<Tensor>>,
    /// First and second moments (float32), one pair per parameter, allocated on its first
    /// step.
    moments: Vec<Option<(Tensor, Tensor)>>,
    /// Steps each parameter has taken (a parameter without a gradient skips a step, as torch).
    param_steps: Vec<u64>,
    base_lr: f64,
    weight_decay: f64,
    betas: (f64, f64),
    warmup_steps: usize,
    steps: usize,
    /// The rank that steps each parameter and holds its master and moments (all 0 unless
    /// the optimizer state is sharded across learner ranks, see [`Self::shard`]).
    owners: Vec<usize>,
    /// This process's rank.
    rank: usize,
    /// Each parameter's shape (a rank that shards parameters holds some of them only while
    /// they are used).
    shapes: Vec<Vec<i64>>,
    /// Parameters whose gradients live on their owner only (sharded parameters): a step
    /// after a backward pass counts for them on every rank, gradient or not.
    owner_only_grads: Vec<bool>,
}

impl ParamOptimizer {
    /// AdamW (`eps` [`EPS`]) over `params`.
    pub(crate) fn new(
        params: Vec<Tensor>,
        lr: f64,
        weight_decay: f64,
        betas: (f64, f64),
        warmup_steps: usize,
    ) -> Result<Self> {
        let n = params.len();
        let masters = tch::no_grad(|| {
            params
                .iter()
                .map(|p| {
                    (p.kind() != tch::Kind::Float).then(|| p.detach().to_kind(tch::Kind::Float))
                })
                .collect()
        });
        Ok(Self {
            masters,
            moments: (0..n).map(|_| None).collect(),
            param_steps: vec![0; n],
            base_lr: lr,
            weight_decay,
            betas,
            warmup_steps,
            steps: 0,
            owners: vec![0; n],
            rank: 0,
            shapes: params.iter().map(Tensor::size).collect(),
            owner_only_grads: vec![false; n],
            params,
        })
    }

    /// Shards the state across `world` ranks as rank `rank`: each parameter gets one owner
    /// (largest parameters first, each to the rank with the fewest elements so far, so every
    /// rank holds about `1/world` of the state); this rank drops the masters and moments of
    /// the parameters it does not own and steps only its own. Every rank computes the same
    /// owners.
    pub(crate) fn shard(&mut self, rank: usize, world: usize) {
        let world = world.max(1);
        let mut order: Vec<usize> = (0..self.params.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.params[i].numel()));
        let mut load = vec![0usize; world];
        for i in order {
            let r = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
            load[r] += self.params[i].numel();
            self.owners[i] = r;
        }
        self.rank = rank;
        self.drop_unowned();
    }

    fn drop_unowned(&mut self) {
        for i in 0..self.params.len() {
            if self.owners[i] != self.rank {
                self.masters[i] = None;
                self.moments[i] = None;
            }
        }
    }

    /// Marks the parameters (`true` at their index) whose gradients only their owner keeps.
    pub(crate) fn set_owner_only_grads(&mut self, which: Vec<bool>) {
        self.owner_only_grads = which;
    }

    /// Whether parameter `i`'s gradient lives on its owner only.
    pub(crate) fn owner_only_grad(&self, i: usize) -> bool {
        self.owner_only_grads[i]
    }

    /// The parameters, in the optimizer's order.
    pub(crate) fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The rank that steps parameter `i`.
    pub(crate) fn owner(&self, i: usize) -> usize {
        self.owners[i]
    }

    /// Whether the state is split across ranks.
    pub(crate) fn is_sharded(&self) -> bool {
        self.owners.iter().any(|&o| o != 0) || self.rank != 0
    }

    /// Learning rate of optimizer step `step` (0-based): linear ramp to the peak over the
    /// warm-up, so the first steps, taken with poor Adam moment estimates, stay small.
    pub(crate) fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            self.base_lr * (step + 1) as f64 / self.warmup_steps as f64
        } else {
            self.base_lr
        }
    }

    /// The weights being trained, in float32: each parameter's master copy, or the parameter
    /// itself where it is float32.
    pub(crate) fn master_weights(&self) -> Vec<Tensor> {
        tch::no_grad(|| {
            self.params
                .iter()
                .zip(&self.masters)
                .map(|(p, m)| m.as_ref().unwrap_or(p).detach().copy())
                .collect()
        })
    }

    /// Steps taken so far.
    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    /// Drops accumulated gradients.
    pub(crate) fn zero_grad(&mut self) -> Result<()> {
        for p in &mut self.params {
            p.zero_grad();
        }
        Ok(())
    }

    /// L2 norm of all gradients together (0 when none is defined); NaN or inf when any
    /// gradient holds one.
    pub(crate) fn grad_norm(&self) -> f64 {
        tch::no_grad(|| {
            let norms: Vec<Tensor> = self
                .params
                .iter()
                .map(Tensor::grad)
                .filter(Tensor::defined)
                .flat_map(|g| {
                    // In slices, so the float64 copies stay small beside an embedding's
                    // gradient (hundreds of millions of elements).
                    g.flatten(0, -1)
                        .split(NORM_SLICE, 0)
                        .into_iter()
                        .map(|part| {
                            part.to_kind(tch::Kind::Double)
                                .square()
                                .sum(tch::Kind::Double)
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            if norms.is_empty() {
                return 0.0;
            }
            Tensor::stack(&norms, 0)
                .sum(tch::Kind::Double)
                .double_value(&[])
                .sqrt()
        })
    }

    /// The sum of squares (float64) of the gradients of the parameters `keep` picks by index.
    pub(crate) fn grad_square_sum(&self, keep: impl Fn(usize) -> bool) -> f64 {
        tch::no_grad(|| {
            let mut sum = 0.0;
            for (i, p) in self.params.iter().enumerate() {
                let g = p.grad();
                if !keep(i) || !g.defined() {
                    continue;
                }
                for part in g.flatten(0, -1).split(NORM_SLICE, 0) {
                    sum += part
                        .to_kind(tch::Kind::Double)
                        .square()
                        .sum(tch::Kind::Double)
                        .double_value(&[]);
                }
            }
            sum
        })
    }

    /// Scales gradients so their norm (`norm`, from [`Self::grad_norm`]) is at most `max`.
    pub(crate) fn clip(&self, norm: f64, max: f64) {
        let coef = max / (norm + 1e-6);
        if coef >= 1.0 {
            return;
        }
        tch::no_grad(|| {
            for p in &self.params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.g_mul_scalar_(coef);
                }
            }
        });
    }

    /// One AdamW step at the scheduled learning rate; returns that rate. `reduced` says
    /// that a backward pass reduced the owner-only gradients since the last step (their
    /// parameters then step on their owners, and count the step on every rank).
    pub(crate) fn step_after(&mut self, reduced: bool) -> Result<f64> {
        let lr = self.lr_at(self.steps);
        let (b1, b2) = self.betas;
        tch::no_grad(|| {
            for (((((param, master), moments), t), owner), owner_only) in self
                .params
                .iter_mut()
                .zip(&mut self.masters)
                .zip(&mut self.moments)
                .zip(&mut self.param_steps)
                .zip(&self.owners)
                .zip(&self.owner_only_grads)
            {
                let g = param.grad();
                if !g.defined() {
                    if *owner_only && reduced && *owner != self.rank {
                        *t += 1;
                    }
                    continue;
                }
                *t += 1;
                if *owner != self.rank {
                    continue;
                }
                let p = master.as_mut().unwrap_or(param);
                // Float32 whatever the parameter's precision: the master's or the parameter's.
                let (m, v) = moments.get_or_insert_with(|| (p.zeros_like(), p.zeros_like()));
                let step_size = lr / (1.0 - b1.powf(*t as f64));
                let bias2_sqrt = (1.0 - b2.powf(*t as f64)).sqrt();
                // Elementwise, so it runs on row slices of a large parameter (an embedding)
                // to keep its two temporaries small.
                let rows = p.size().first().copied().unwrap_or(1).max(1);
                let slice_rows = (NORM_SLICE / (p.numel() as i64 / rows).max(1)).max(1);
                for start in (0..rows).step_by(slice_rows as usize) {
                    let n = slice_rows.min(rows - start);
                    let cut = |x: &Tensor| {
                        if p.dim() == 0 {
                            x.shallow_clone()
                        } else {
                            x.narrow(0, start, n)
                        }
                    };
                    let g = cut(&g).to_kind(tch::Kind::Float);
                    let (mut p, mut m, mut v) = (cut(p), cut(m), cut(v));
                    if self.weight_decay != 0.0 {
                        let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
                    }
                    let _ = m.lerp_(&g, 1.0 - b1);
                    let _ = v.g_mul_scalar_(b2);
                    let _ = v.addcmul_(&(&g * (1.0 - b2)), &g);
                    // p -= step_size * m / (sqrt(v) / bias2_sqrt + eps), with one temporary:
                    // the step size goes into the denominator.
                    let mut denom = v.sqrt();
                    let _ = denom.g_div_scalar_(bias2_sqrt);
                    let _ = denom.g_add_scalar_(EPS);
                    let _ = denom.g_div_scalar_(-step_size);
                    let _ = p.addcdiv_(&m, &denom);
                }
                if let Some(master) = master {
                    param.copy_(master);
                }
            }
        });
        self.steps += 1;
        Ok(lr)
    }

    /// The optimizer's state as named tensors under `prefix`: each parameter's moments and
    /// step count, and the schedule's step. (A sharded optimizer's own part only: see
    /// [`Self::state_gathered`].)
    pub(crate) fn state(&self, prefix: &str) -> Vec<(String, Tensor)> {
        state_of(
            prefix,
            self.steps,
            &self.param_steps,
            &self.masters,
            &self.moments,
        )
    }

    /// [`Self::state`] of the whole optimizer, on every rank, when its state is sharded: each
    /// owner broadcasts its parameters' masters and moments. A collective: every rank calls
    /// it.
    pub(crate) fn state_gathered(
        &self,
        prefix: &str,
        group: &ProcessGroup,
    ) -> Result<Vec<(String, Tensor)>> {
        if !self.is_sharded() {
            return Ok(self.state(prefix));
        }
        let mut masters = Vec::with_capacity(self.params.len());
        let mut moments = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter().enumerate() {
            let owner = self.owners[i];
            let take = |local: Option<&Tensor>| -> Result<Tensor> {
                let mut t = match local {
                    Some(t) if owner == self.rank => t.to_device(tch::Device::Cpu).contiguous(),
                    _ => Tensor::zeros(&self.shapes[i][..], (tch::Kind::Float, tch::Device::Cpu)),
                };
                group.broadcast(&mut t, owner, &format!("{prefix} optimizer state {i}"))?;
                Ok(t)
            };
            masters.push(if p.kind() != tch::Kind::Float {
                Some(take(self.masters[i].as_ref())?)
            } else {
                None
            });
            moments.push(if self.param_steps[i] > 0 {
                let local = self.moments[i].as_ref();
                Some((take(local.map(|(m, _)| m))?, take(local.map(|(_, v)| v))?))
            } else {
                None
            });
        }
        Ok(state_of(
            prefix,
            self.steps,
            &self.param_steps,
            &masters,
            &moments,
        ))
    }

    /// Restores [`Self::state`] (tensors named under `prefix`), checking that every shape
    /// matches its parameter; `source` names the file for errors.
    pub(crate) fn load_state(
        &mut self,
        prefix: &str,
        tensors: &[(String, Tensor)],
        source: &Path,
    ) -> Result<()> {
        let get = |name: String| tensors.iter().find(|(n, _)| *n == name).map(|(_, t)| t);
        let bad = |what: String| {
            Error::invalid("optimizer state", format!("{}: {what}", source.display()))
        };
        let int = |name: String| -> Result<u64> {
            let t = get(name.clone()).ok_or_else(|| bad(format!("`{name}` is missing")))?;
            u64::try_from(t.int64_value(&[0])).map_err(|_| bad(format!("`{name}` is negative")))
        };
        let steps = int(format!("{prefix}.schedule_step"))? as usize;
        let mut moments = Vec::with_capacity(self.params.len());
        let mut param_steps = Vec::with_capacity(self.params.len());
        let mut masters = Vec::with_capacity(self.params.len());
        for (i, param) in self.params.iter().enumerate() {
            let shape = &self.shapes[i];
            param_steps.push(int(format!("{prefix}.{i}.step"))?);
            let has_master = param.kind() != tch::Kind::Float;
            let master = match (has_master, get(format!("{prefix}.{i}.master"))) {
                (true, Some(t)) if t.size() == *shape && t.kind() == tch::Kind::Float => {
                    Some(t.to_device(param.device()))
                }
                (false, None) => None,
                (true, None) => {
                    return Err(bad(format!(
                        "`{prefix}.{i}.master` is missing: parameter {i} is {:?} and trains \
                         on a float32 master copy",
                        param.kind()
                    )))
                }
                (_, Some(t)) => {
                    return Err(bad(format!(
                        "`{prefix}.{i}.master` is {:?} {:?}, the parameter is {:?} {:?}",
                        t.size(),
                        t.kind(),
                        shape,
                        param.kind()
                    )))
                }
            };
            // The moments are float32, like the master (or the parameter itself).
            let kind = master.as_ref().map_or(param.kind(), Tensor::kind);
            let pair = match (
                get(format!("{prefix}.{i}.exp_avg")),
                get(format!("{prefix}.{i}.exp_avg_sq")),
            ) {
                (Some(m), Some(v)) => {
                    for (name, t) in [("exp_avg", m), ("exp_avg_sq", v)] {
                        if t.size() != *shape || t.kind() != kind {
                            return Err(bad(format!(
                                "`{prefix}.{i}.{name}` is {:?} {:?}, the parameter is {:?} {:?}",
                                t.size(),
                                t.kind(),
                                shape,
                                kind
                            )));
                        }
                    }
                    Some((m.to_device(param.device()), v.to_device(param.device())))
                }
                (None, None) => None,
                _ => {
                    return Err(bad(format!(
                        "parameter {i} has only one of its two moments"
                    )))
                }
            };
            moments.push(pair);
            masters.push(master);
        }
        if get(format!("{prefix}.{}.step", self.params.len())).is_some() {
            return Err(bad(format!(
                "more parameters than the {} this optimizer has",
                self.params.len()
            )));
        }
        tch::no_grad(|| {
            for (param, master) in self.params.iter_mut().zip(&masters) {
                // A sharded parameter this rank holds no data of takes it from its owner.
                if let Some(master) = master.as_ref().filter(|m| m.numel() == param.numel()) {
                    param.copy_(master);
                }
            }
        });
        self.steps = steps;
        self.masters = masters;
        self.moments = moments;
        self.param_steps = param_steps;
        self.drop_unowned();
        Ok(())
    }
}

/// The named tensors of [`ParamOptimizer::state`].
fn state_of(
    prefix: &str,
    steps: usize,
    param_steps: &[u64],
    masters: &[Option<Tensor>],
    moments: &[Option<(Tensor, Tensor)>],
) -> Vec<(String, Tensor)> {
    let mut out = vec![(
        format!("{prefix}.schedule_step"),
        Tensor::from_slice(&[steps as i64]),
    )];
    for (i, (m, t)) in moments.iter().zip(param_steps).enumerate() {
        out.push((
            format!("{prefix}.{i}.step"),
            Tensor::from_slice(&[*t as i64]),
        ));
        if let Some(master) = &masters[i] {
            out.push((
                format!("{prefix}.{i}.master"),
                master.to_device(tch::Device::Cpu),
            ));
        }
        if let Some((m, v)) = m {
            out.push((
                format!("{prefix}.{i}.exp_avg"),
                m.to_device(tch::Device::Cpu),
            ));
            out.push((
                format!("{prefix}.{i}.exp_avg_sq"),
                v.to_device(tch::Device::Cpu),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::*;

    #[test]
    fn warms_up_linearly_clips_and_steps() {
        let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let mut opt =
            ParamOptimizer::new(vec![w.shallow_clone()], 0.1, 0.0, (0.9, 0.999), 4).unwrap();
        assert!((opt.lr_at(0) - 0.025).abs() < 1e-12);
        assert!((opt.lr_at(3) - 0.1).abs() < 1e-12);
        assert!((opt.lr_at(10) - 0.1).abs() < 1e-12);
        assert_eq!(opt.grad_norm(), 0.0);
        // d/dw sum(w^2) = 2w = (6, 8): norm 10.
        (&w * &w).sum(Kind::Float).backward();
        let norm = opt.grad_norm();
        assert!((norm - 10.0).abs() < 1e-5);
        opt.clip(norm, 1.0);
        assert!((opt.grad_norm() - 1.0).abs() < 1e-4);
        let before = Vec::<f32>::try_from(w.detach()).unwrap();
        assert!((opt.step_after(false).unwrap() - 0.025).abs() < 1e-12);
        let after = Vec::<f32>::try_from(w.detach()).unwrap();
        assert!(after[0] < before[0] && after[1] < before[1]);
        assert_eq!(opt.steps(), 1);
    }

    /// Gradients of a fixed loss for `w`, so two optimizers can be fed the same ones.
    fn set_grad(w: &Tensor, step: i64) {
        let target = Tensor::arange(w.numel() as i64, (Kind::Float, tch::Device::Cpu))
            .reshape(w.size())
            .g_mul_scalar(0.1 * (step + 1) as f64);
        ((w - target).square() * w.abs())
            .sum(Kind::Float)
            .backward();
    }

    #[test]
    fn matches_libtorch_adamw_step_for_step() {
        let init = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.0, 3.0, -0.25]).reshape([2, 3]);
        let ours_w = init.copy().set_requires_grad(true);
        let theirs_w = init.copy().set_requires_grad(true);
        let mut ours =
            ParamOptimizer::new(vec![ours_w.shallow_clone()], 0.05, 0.1, (0.9, 0.95), 0).unwrap();
        let mut theirs = tch::COptimizer::adamw(0.05, 0.9, 0.95, 0.1, 1e-8, false).unwrap();
        theirs.add_parameters(&theirs_w, 0).unwrap();
        for step in 0..20 {
            ours.zero_grad().unwrap();
            theirs.zero_grad().unwrap();
            set_grad(&ours_w, step);
            set_grad(&theirs_w, step);
            ours.step_after(false).unwrap();
            theirs.step().unwrap();
        }
        let diff = (&ours_w - &theirs_w).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "ours and libtorch's AdamW differ by {diff}");
        let moved = (&ours_w - &init).abs().max().double_value(&[]);
        assert!(
            moved > 0.1,
            "20 steps at lr 0.05 moved the weights by only {moved}"
        );
    }

    #[test]
    fn a_restored_state_continues_exactly() {
        // Trainable copies of (w, b) and a fresh optimizer over them.
        let make = |w: &Tensor, b: &Tensor| {
            let (w, b) = (
                w.detach().copy().set_requires_grad(true),
                b.detach().copy().set_requires_grad(true),
            );
            let opt = ParamOptimizer::new(
                vec![w.shallow_clone(), b.shallow_clone()],
                0.1,
                0.01,
                (0.9, 0.999),
                2,
            )
            .unwrap();
            (w, b, opt)
        };
        let (init, bias) = (
            Tensor::from_slice(&[1.0f32, -2.0, 0.5]),
            Tensor::from_slice(&[0.1f32]),
        );
        let (w1, b1, mut uninterrupted) = make(&init, &bias);
        let (w2, b2, mut first) = make(&init, &bias);
        let loss = |w: &Tensor, b: &Tensor, k: i64| {
            ((w * (k + 1)).square().sum(Kind::Float) + b * w.sum(Kind::Float)).sum(Kind::Float)
        };
        for k in 0..3 {
            for (w, b, opt) in [(&w1, &b1, &mut uninterrupted), (&w2, &b2, &mut first)] {
                opt.zero_grad().unwrap();
                loss(w, b, k).backward();
                opt.step_after(false).unwrap();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        Tensor::write_safetensors(&first.state("actor"), &path).unwrap();
        // A resumed run: the weights as saved, a fresh optimizer, the state loaded; and a
        // restarted one without the state.
        let (w3, b3, mut resumed) = make(&w2, &b2);
        let saved = Tensor::read_safetensors(&path).unwrap();
        resumed.load_state("actor", &saved, &path).unwrap();
        assert_eq!(resumed.steps(), 3);
        let (w4, b4, mut restarted) = make(&w2, &b2);
        for k in 3..6 {
            for (w, b, opt) in [
                (&w1, &b1, &mut uninterrupted),
                (&w3, &b3, &mut resumed),
                (&w4, &b4, &mut restarted),
            ] {
                opt.zero_grad().unwrap();
                loss(w, b, k).backward();
                opt.step_after(false).unwrap();
            }
        }
        let gap = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
        assert_eq!(
            gap(&w1, &w3),
            0.0,
            "resumed weights differ from the uninterrupted run"
        );
        assert_eq!(gap(&b1, &b3), 0.0);
        assert!(
            gap(&w1, &w4) > 1e-3,
            "without the state the run should differ"
        );

        // A state for other parameters is refused with the file named.
        let other = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        let mut wrong =
            ParamOptimizer::new(vec![other, bias.copy()], 0.1, 0.0, (0.9, 0.999), 0).unwrap();
        let e = wrong
            .load_state("actor", &saved, &path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("optimizer.safetensors") && e.contains("exp_avg"),
            "{e}"
        );
        let e = wrong
            .load_state("critic", &saved, &path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("critic.schedule_step") && e.contains("missing"),
            "{e}"
        );
    }

    #[test]
    fn reports_non_finite_gradients() {
        let w = Tensor::from_slice(&[1.0f32]).set_requires_grad(true);
        let opt = ParamOptimizer::new(vec![w.shallow_clone()], 0.1, 0.0, (0.9, 0.999), 0).unwrap();
        (&w * f64::NAN).sum(Kind::Float).backward();
        assert!(!opt.grad_norm().is_finite());
    }
}
