//! Token sampling with the log-probabilities the learner needs.
//!
//! The log-probability returned for a token is under the policy at the sampling temperature
//! *without* top-k/top-p truncation: truncation is a property of the sampler, not of the
//! policy, and the PPO importance ratio must compare the same distribution the learner
//! recomputes. At temperature 0 (greedy) it is the log-probability at temperature 1.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::{Error, Result};

/// How to pick tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1.0 = off).
    pub top_p: f64,
    /// Longest generation.
    pub max_new_tokens: usize,
    /// Tokens that end a generation (included in the output).
    pub stop_token_ids: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            max_new_tokens: 256,
            stop_token_ids: vec![],
        }
    }
}

impl SamplingParams {
    /// Checks ranges, naming the flag that is out of range.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::invalid(
                "temperature",
                format!("must be a finite number >= 0, got {}", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::invalid(
                "top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::invalid("max_new_tokens", "must be at least 1"));
        }
        Ok(())
    }

    /// Whether sampling is greedy.
    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Picks one token per row from `logits` [B, V] with libtorch's global RNG; returns
/// (tokens [B] int64, logprobs [B] f32).
pub fn sample(logits: &Tensor, params: &SamplingParams) -> (Tensor, Tensor) {
    let draws = if params.greedy() {
        None
    } else {
        let rows = logits.size()[0];
        Some(Tensor::rand([rows], (Kind::Double, tch::Device::Cpu)))
    };
    pick(logits, params, draws)
}

/// Like [`sample`], but row `i` is decided by the uniform draw `draws[i]` in [0, 1) alone
/// (inverse-CDF sampling). The engine derives each draw from (seed, episode, position), so
/// what an episode samples does not depend on which other sequences shared its batch: a
/// run with a fixed seed is reproducible under continuous batching.
pub fn sample_with_draws(
    logits: &Tensor,
    params: &SamplingParams,
    draws: &[f64],
) -> (Tensor, Tensor) {
    let draws = (!params.greedy()).then(|| Tensor::from_slice(draws));
    pick(logits, params, draws)
}

/// One row of a batch to sample: its settings and its uniform draw in [0, 1) (ignored when
/// greedy).
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    /// Temperature, top-k and top-p of the row.
    pub params: &'a SamplingParams,
    /// The row's draw, e.g. [`token_draw`] of its episode and position.
    pub draw: f64,
}

/// Picks one token for every row of `logits` [B, V] in one pass on the logits' device, each
/// row under its own temperature, top-k, top-p and draw, exactly as [`sample_with_draws`]
/// picks it for that row alone: a row's result does not depend on the other rows. Returns
/// [B, 2] float64 (token id, log-probability), so that one device-to-host copy brings the
/// whole batch back. The settings go to the device in one copy too.
pub fn sample_batch(logits: &Tensor, rows: &[RowSampling<'_>]) -> Tensor {
    let vocab = logits.size()[1];
    let settings = Tensor::from_slice(&row_settings(rows, vocab))
        .view([4, rows.len() as i64])
        .to_device(logits.device());
    sample_with_settings(logits, &settings, SampleMode::of(rows, vocab))
}

/// Which operations a batch's rows need from the sampler: a pass runs only those, and a
/// CUDA graph of a decode step is captured for one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SampleMode {
    /// Every row is greedy.
    pub all_greedy: bool,
    /// Some row is greedy.
    pub any_greedy: bool,
    /// Some sampled row truncates by top-k or top-p.
    pub truncates: bool,
}

impl SampleMode {
    /// The mode of `rows` over a vocabulary of `vocab` tokens.
    pub fn of(rows: &[RowSampling<'_>], vocab: i64) -> Self {
        let greedy = rows.iter().filter(|r| r.params.greedy()).count();
        Self {
            all_greedy: greedy == rows.len(),
            any_greedy: greedy > 0,
            truncates: rows.iter().any(|r| {
                !r.params.greedy()
                    && ((r.params.top_k > 0 && (r.params.top_k as i64) < vocab)
                        || r.params.top_p < 1.0)
            }),
        }
    }

    /// The mode once greedy padding rows ([`PADDING_SETTINGS`]) join the batch.
    pub fn with_padding(self) -> Self {
        Self {
            any_greedy: true,
            ..self
        }
    }
}

/// A padding row's settings in [`row_settings`]' layout: greedy, nothing truncated.
pub const PADDING_SETTINGS: [f64; 4] = [1.0, f64::INFINITY, 2.0, -1.0];

/// Each row's [temperature (1 when greedy), top_k (vocab when off), top_p (2 when off), draw
/// (-1 when greedy)], laid out as [4, n] (all temperatures first).
pub fn row_settings(rows: &[RowSampling<'_>], vocab: i64) -> Vec<f64> {
    let mut host = Vec::with_capacity(4 * rows.len());
    host.extend(rows.iter().map(|r| match r.params.greedy() {
        true => 1.0,
        false => r.params.temperature,
    }));
    host.extend(rows.iter().map(|r| match r.params.top_k {
        k if k > 0 && (k as i64) < vocab => k as f64,
        _ => vocab as f64,
    }));
    host.extend(rows.iter().map(|r| match r.params.top_p {
        p if p < 1.0 => p,
        _ => 2.0,
    }));
    host.extend(rows.iter().map(|r| match r.params.greedy() {
        true => -1.0,
        false => r.draw,
    }));
    host
}

/// [`sample_batch`] with the settings already on the device ([4, B] float64, as
/// [`row_settings`] lays them out) and the mode of the rows: no host work, no copy, so a
/// CUDA graph can hold it.
pub fn sample_with_settings(logits: &Tensor, settings: &Tensor, mode: SampleMode) -> Tensor {
    let vocab = logits.size()[1];
    let logits = logits.to_kind(Kind::Float);
    let column = |i: i64| settings.get(i).unsqueeze(-1);
    let scaled = &logits / column(0).to_kind(Kind::Float);
    let tokens = if mode.all_greedy {
        logits.argmax(-1, false)
    } else {
        let filtered = match mode.truncates {
            true => truncate_rows(
                &scaled,
                &column(1).clamp_max(vocab as f64).to_kind(Kind::Int64),
                &column(2).to_kind(Kind::Float),
            ),
            false => scaled.shallow_clone(),
        };
        let draws = column(3);
        let sampled = inverse_cdf(&filtered, &draws);
        match mode.any_greedy {
            false => sampled,
            true => logits
                .argmax(-1, false)
                .where_self(&draws.squeeze_dim(-1).lt(0.0), &sampled),
        }
    };
    // The log-probability under the temperature, untruncated (1 when greedy).
    let logprobs = scaled
        .log_softmax(-1, Kind::Float)
        .gather(-1, &tokens.unsqueeze(-1), false)
        .squeeze_dim(-1);
    Tensor::stack(
        &[tokens.to_kind(Kind::Double), logprobs.to_kind(Kind::Double)],
        1,
    )
}

/// The first token of each row whose cumulative probability (float64) exceeds the row's draw
/// times the row's total; tokens at -inf add nothing, so they are never picked.
fn inverse_cdf(logits: &Tensor, draws: &Tensor) -> Tensor {
    let cdf = logits.softmax(-1, Kind::Double).cumsum(-1, Kind::Double);
    let vocab = cdf.size()[1];
    let total = cdf.select(1, vocab - 1).unsqueeze(-1);
    let threshold = draws.to_kind(Kind::Double) * &total;
    // The cumulative sum never decreases, so the count of entries at or below the threshold
    // is where a binary search puts it: O(log V) per row instead of a pass over V.
    threshold
        .searchsorted(&cdf, false, true, "right", None::<Tensor>)
        .squeeze_dim(-1)
        .clamp_max(vocab - 1)
}

/// [`truncate`] with each row's own `top_k` [B, 1] (vocab = off) and `top_p` [B, 1] (above 1
/// = off).
fn truncate_rows(logits: &Tensor, top_k: &Tensor, top_p: &Tensor) -> Tensor {
    let vocab = logits.size()[1];
    let (sorted, order) = logits.sort(-1, true);
    let ranks = Tensor::arange(vocab, (Kind::Int64, logits.device())).unsqueeze(0);
    let probs = sorted.softmax(-1, Kind::Float);
    let before = probs.cumsum(-1, Kind::Float) - &probs;
    let drop = ranks
        .ge_tensor(top_k)
        .logical_or(&before.ge_tensor(top_p))
        .logical_and(&ranks.ge(1));
    let sorted = sorted.masked_fill(&drop, f64::NEG_INFINITY);
    logits
        .full_like(f64::NEG_INFINITY)
        .scatter(-1, &order, &sorted)
}

/// The uniform draw in [0, 1) for one token of one episode: a pure function of its inputs
/// (splitmix64), so no RNG state is shared between rows.
pub fn token_draw(seed: u64, episode: u64, position: u64) -> f64 {
    let mut x = seed ^ mix(episode ^ mix(position.wrapping_add(0x5851_f42d_4c95_7f2d)));
    x = mix(x);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn pick(logits: &Tensor, params: &SamplingParams, draws: Option<Tensor>) -> (Tensor, Tensor) {
    let logits = logits.to_kind(Kind::Float);
    let Some(draws) = draws else {
        let tokens = logits.argmax(-1, false);
        let logprobs = logits
            .log_softmax(-1, Kind::Float)
            .gather(-1, &tokens.unsqueeze(-1), false)
            .squeeze_dim(-1);
        return (tokens, logprobs);
    };
    let scaled = logits / params.temperature;
    let logprobs_all = scaled.log_softmax(-1, Kind::Float);
    let filtered = truncate(&scaled, params.top_k, params.top_p);
    // Inverse CDF in float64: the first token whose cumulative probability exceeds the draw.
    // Tokens cut by top-k/top-p add nothing to the sum, so they are never picked.
    let cdf = filtered.softmax(-1, Kind::Double).cumsum(-1, Kind::Double);
    let vocab = cdf.size()[1];
    let total = cdf.select(1, vocab - 1).unsqueeze(-1);
    let threshold = draws
        .to_device(cdf.device())
        .to_kind(Kind::Double)
        .unsqueeze(-1)
        * &total;
    let tokens = cdf
        .le_tensor(&threshold)
        .sum_dim_intlist(-1, false, Kind::Int64)
        .clamp_max(vocab - 1);
    let logprobs = logprobs_all
        .gather(-1, &tokens.unsqueeze(-1), false)
        .squeeze_dim(-1);
    (tokens, logprobs)
}

/// Sets logits outside the top-k / top-p set to -inf (the most likely token always stays).
fn truncate(logits: &Tensor, top_k: usize, top_p: f64) -> Tensor {
    let vocab = logits.size()[1];
    let use_k = top_k > 0 && (top_k as i64) < vocab;
    if !use_k && top_p >= 1.0 {
        return logits.shallow_clone();
    }
    let (sorted, order) = logits.sort(-1, true);
    let ranks = Tensor::arange(vocab, (Kind::Int64, logits.device())).unsqueeze(0);
    let mut drop = ranks.zeros_like().to_kind(Kind::Bool);
    if use_k {
        drop = drop.logical_or(&ranks.ge(top_k as i64));
    }
    if top_p < 1.0 {
        let probs = sorted.softmax(-1, Kind::Float);
        let before = probs.cumsum(-1, Kind::Float) - &probs;
        drop = drop.logical_or(&before.ge(top_p));
    }
    let drop = drop.logical_and(&ranks.ge(1));
    let sorted = sorted.masked_fill(&drop, f64::NEG_INFINITY);
    logits
        .full_like(f64::NEG_INFINITY)
        .scatter(-1, &order, &sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_and_top_p_keep_the_right_tokens() {
        let logits = Tensor::from_slice(&[0.0f32, 3.0, 1.0, 2.0]).view([1, 4]);
        let k2 = truncate(&logits, 2, 1.0);
        let kept: Vec<bool> = Vec::try_from(k2.isfinite().view([-1])).unwrap();
        assert_eq!(kept, vec![false, true, false, true]);
        // probs ~ [0.032, 0.644, 0.087, 0.237]: top_p 0.7 keeps tokens 1 and 3.
        let p = truncate(&logits, 0, 0.7);
        let kept: Vec<bool> = Vec::try_from(p.isfinite().view([-1])).unwrap();
        assert_eq!(kept, vec![false, true, false, true]);
        let tiny = truncate(&logits, 0, 1e-9);
        let kept: Vec<bool> = Vec::try_from(tiny.isfinite().view([-1])).unwrap();
        assert_eq!(kept, vec![false, true, false, false]);
    }

    #[test]
    fn logprob_is_untruncated_at_temperature() {
        tch::manual_seed(0);
        let logits = Tensor::from_slice(&[0.0f32, 3.0, 1.0, 2.0]).view([1, 4]);
        let params = SamplingParams {
            temperature: 2.0,
            top_k: 1,
            ..Default::default()
        };
        let (tok, lp) = sample(&logits, &params);
        assert_eq!(tok.int64_value(&[0]), 1);
        let expected = (&logits / 2.0)
            .log_softmax(-1, Kind::Float)
            .double_value(&[0, 1]);
        assert!((lp.double_value(&[0]) - expected).abs() < 1e-6);
    }

    #[test]
    fn draws_follow_the_distribution_and_respect_truncation() {
        let logits = Tensor::from_slice(&[0.0f32, 3.0, 1.0, 2.0]).view([1, 4]);
        let params = SamplingParams::default();
        let probs: Vec<f64> = Vec::try_from(logits.softmax(-1, Kind::Double).view([-1])).unwrap();
        let n = 20_000;
        let draws: Vec<f64> = (0..n).map(|i| token_draw(5, 1, i)).collect();
        let wide = logits.expand([n as i64, 4], false);
        let (tok, _) = sample_with_draws(&wide, &params, &draws);
        let tok: Vec<i64> = Vec::try_from(tok).unwrap();
        for (t, p) in probs.iter().enumerate() {
            let freq = tok.iter().filter(|&&x| x == t as i64).count() as f64 / n as f64;
            assert!((freq - p).abs() < 0.015, "token {t}: {freq} vs {p}");
        }
        // Same draw, same token; a draw of 0 takes the first token with mass.
        let (again, _) = sample_with_draws(&wide, &params, &draws);
        assert_eq!(Vec::<i64>::try_from(again).unwrap(), tok);
        let top2 = SamplingParams {
            top_k: 2,
            ..Default::default()
        };
        let (t, _) = sample_with_draws(&logits, &top2, &[0.0]);
        assert_eq!(t.int64_value(&[0]), 1);
        let (t, _) = sample_with_draws(&logits, &top2, &[0.999_999]);
        assert_eq!(t.int64_value(&[0]), 3);
    }

    #[test]
    fn validation_names_the_flag() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
    }

    /// Rows with every kind of setting side by side: greedy, plain, hot and cold, top-k,
    /// top-p, both, and a top-k past the vocabulary (off).
    fn mixed_rows() -> Vec<SamplingParams> {
        let p = |temperature: f64, top_k: usize, top_p: f64| SamplingParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        };
        vec![
            p(0.0, 0, 1.0),
            p(1.0, 0, 1.0),
            p(0.7, 0, 1.0),
            p(1.3, 5, 1.0),
            p(1.0, 0, 0.8),
            p(0.9, 7, 0.6),
            p(1.0, 1000, 1.0),
            p(0.0, 3, 0.5),
            p(2.0, 1, 1.0),
            p(1.0, 0, 1e-9),
        ]
    }

    fn batch(logits: &Tensor, params: &[SamplingParams], draws: &[f64]) -> Vec<(i64, f64)> {
        let rows: Vec<RowSampling<'_>> = params
            .iter()
            .zip(draws)
            .map(|(params, &draw)| RowSampling { params, draw })
            .collect();
        let picked: Vec<f64> = Vec::try_from(sample_batch(logits, &rows).view([-1])).unwrap();
        picked.chunks(2).map(|p| (p[0] as i64, p[1])).collect()
    }

    #[test]
    fn a_batch_with_mixed_settings_picks_what_each_row_picks_alone() {
        tch::manual_seed(3);
        let params = mixed_rows();
        let n = params.len() as i64;
        for round in 0..20u64 {
            let logits = Tensor::randn([n, 50], (Kind::Float, tch::Device::Cpu)) * 3.0;
            let draws: Vec<f64> = (0..n as u64).map(|i| token_draw(round, i, 7)).collect();
            let together = batch(&logits, &params, &draws);
            for (i, p) in params.iter().enumerate() {
                let row = logits.narrow(0, i as i64, 1);
                let (tok, lp) = sample_with_draws(&row, p, &draws[i..=i]);
                assert_eq!(
                    together[i].0,
                    tok.int64_value(&[0]),
                    "round {round} row {i} {p:?}"
                );
                assert_eq!(
                    together[i].1,
                    lp.double_value(&[0]),
                    "round {round} row {i} {p:?}"
                );
            }
        }
    }

    #[test]
    fn greedy_padding_rows_change_nothing_for_the_real_rows() {
        // A decode graph pads its batch with rows of PADDING_SETTINGS and samples in the
        // padded mode: the real rows must pick what they pick alone.
        tch::manual_seed(5);
        let params = mixed_rows();
        let n = params.len();
        let pad = 3;
        let logits = Tensor::randn([(n + pad) as i64, 40], (Kind::Float, tch::Device::Cpu)) * 2.0;
        let draws: Vec<f64> = (0..n as u64).map(|i| token_draw(11, i, 2)).collect();
        let rows: Vec<RowSampling<'_>> = params
            .iter()
            .zip(&draws)
            .map(|(params, &draw)| RowSampling { params, draw })
            .collect();
        let alone: Vec<f64> =
            Vec::try_from(sample_batch(&logits.narrow(0, 0, n as i64), &rows).view([-1])).unwrap();
        let settings = row_settings(&rows, 40);
        let mut padded = Vec::new();
        for (column, padding) in PADDING_SETTINGS.iter().enumerate() {
            padded.extend_from_slice(&settings[column * n..(column + 1) * n]);
            padded.extend(std::iter::repeat_n(*padding, pad));
        }
        let settings = Tensor::from_slice(&padded).view([4, (n + pad) as i64]);
        let mode = SampleMode::of(&rows, 40).with_padding();
        let together: Vec<f64> =
            Vec::try_from(sample_with_settings(&logits, &settings, mode).view([-1])).unwrap();
        assert_eq!(&together[..2 * n], &alone[..]);
        // The padding rows are greedy.
        for p in 0..pad {
            let row = (n + p) as i64;
            assert_eq!(
                together[2 * (n + p)] as i64,
                logits.get(row).argmax(0, false).int64_value(&[])
            );
        }
    }

    #[test]
    fn a_row_picks_the_same_whatever_else_is_in_the_batch() {
        tch::manual_seed(4);
        let params = mixed_rows();
        let n = params.len();
        let logits = Tensor::randn([n as i64, 64], (Kind::Float, tch::Device::Cpu)) * 2.0;
        let draws: Vec<f64> = (0..n as u64).map(|i| token_draw(9, i, 1)).collect();
        let whole = batch(&logits, &params, &draws);
        // Reversed, and every row alone or with one other row of other settings.
        let order: Vec<usize> = (0..n).rev().collect();
        let index = Tensor::from_slice(&order.iter().map(|&i| i as i64).collect::<Vec<_>>());
        let reversed = batch(
            &logits.index_select(0, &index),
            &order.iter().map(|&i| params[i].clone()).collect::<Vec<_>>(),
            &order.iter().map(|&i| draws[i]).collect::<Vec<_>>(),
        );
        for (k, &i) in order.iter().enumerate() {
            assert_eq!(reversed[k], whole[i], "row {i}");
        }
        for i in 0..n {
            let other = (i + 3) % n;
            let index = Tensor::from_slice(&[i as i64, other as i64]);
            let pair = batch(
                &logits.index_select(0, &index),
                &[params[i].clone(), params[other].clone()],
                &[draws[i], draws[other]],
            );
            assert_eq!(pair[0], whole[i], "row {i} beside row {other}");
        }
    }
}
