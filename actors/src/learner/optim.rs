//! AdamW over an explicit list of parameters, with linear warm-up and a gradient-norm check.
//!
//! tch's `nn::Optimizer` always takes a whole `VarStore`; the learner needs two optimizers over
//! one store when the value head shares the policy's trunk (the head at the critic's learning
//! rate, the rest at the actor's), and it needs the gradient norm *before* clipping to refuse
//! non-finite gradients, which `clip_grad_norm` neither returns nor checks.

use tch::{COptimizer, Tensor};

use crate::Result;

/// One AdamW optimizer and its schedule.
#[derive(Debug)]
pub(crate) struct ParamOptimizer {
    opt: COptimizer,
    params: Vec<Tensor>,
    base_lr: f64,
    warmup_steps: usize,
    steps: usize,
}

impl ParamOptimizer {
    /// AdamW (`eps` 1e-8, as torch) over `params`.
    pub(crate) fn new(
        params: Vec<Tensor>,
        lr: f64,
        weight_decay: f64,
        betas: (f64, f64),
        warmup_steps: usize,
    ) -> Result<Self> {
        let mut opt = COptimizer::adamw(lr, betas.0, betas.1, weight_decay, 1e-8, false)?;
        for p in &params {
            opt.add_parameters(p, 0)?;
        }
        Ok(Self {
            opt,
            params,
            base_lr: lr,
            warmup_steps,
            steps: 0,
        })
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

    /// Steps taken so far.
    pub(crate) fn steps(&self) -> usize {
        self.steps
    }

    /// Drops accumulated gradients.
    pub(crate) fn zero_grad(&mut self) -> Result<()> {
        self.opt.zero_grad()?;
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
                .map(|g| g.to_kind(tch::Kind::Double).square().sum(tch::Kind::Double))
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

    /// One AdamW step at the scheduled learning rate; returns that rate.
    pub(crate) fn step(&mut self) -> Result<f64> {
        let lr = self.lr_at(self.steps);
        self.opt.set_learning_rate(lr)?;
        self.opt.step()?;
        self.steps += 1;
        Ok(lr)
    }
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
        assert!((opt.step().unwrap() - 0.025).abs() < 1e-12);
        let after = Vec::<f32>::try_from(w.detach()).unwrap();
        assert!(after[0] < before[0] && after[1] < before[1]);
        assert_eq!(opt.steps(), 1);
    }

    #[test]
    fn reports_non_finite_gradients() {
        let w = Tensor::from_slice(&[1.0f32]).set_requires_grad(true);
        let opt = ParamOptimizer::new(vec![w.shallow_clone()], 0.1, 0.0, (0.9, 0.999), 0).unwrap();
        (&w * f64::NAN).sum(Kind::Float).backward();
        assert!(!opt.grad_norm().is_finite());
    }
}
