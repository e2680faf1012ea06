//! Batched generation with a KV cache: left-padded prefill, then one decode step per token
//! for every row until each row has stopped.
//!
//! This is the plain batch generator behind `agent-r1 generate` and the parity tests. The
//! inference engine's continuous batching builds on the same `forward` with its own cache
//! management.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::sampling::{sample, SamplingParams};
use super::PolicyModel;
use crate::{Error, Result};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled (it is the last token of the output).
    Stop,
    /// `max_new_tokens` was reached.
    Length,
    /// The sequence filled the engine's context capacity.
    ContextFull,
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The generated tokens only.
    pub token_ids: Vec<u32>,
    /// Log-probability of each generated token under the sampling policy (see
    /// [`super::sampling`] for exactly which distribution).
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

impl PolicyModel {
    /// Generates a continuation for each prompt.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Generation>> {
        params.validate()?;
        if prompts.is_empty() {
            return Ok(vec![]);
        }
        if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
            return Err(Error::invalid(
                "prompt",
                format!("prompt {i} has no tokens"),
            ));
        }
        for p in prompts {
            self.check_ids(p)?;
        }
        tch::no_grad(|| self.generate_inner(prompts, params))
    }

    fn generate_inner(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Generation>> {
        let device = self.placement().device;
        let b = prompts.len();
        let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = vec![0i64; b * max_len];
        let mut mask = vec![false; b * max_len];
        for (row, p) in prompts.iter().enumerate() {
            let pad = max_len - p.len();
            for (j, &tok) in p.iter().enumerate() {
                ids[row * max_len + pad + j] = tok as i64;
                mask[row * max_len + pad + j] = true;
            }
        }
        let ids = Tensor::from_slice(&ids)
            .view([b as i64, max_len as i64])
            .to_device(device);
        let mask = Tensor::from_slice(&mask)
            .view([b as i64, max_len as i64])
            .to_device(device);
        let mut cache = self.new_cache(b as i64, (max_len + params.max_new_tokens) as i64);
        let hidden = self.forward(&ids, &mask, Some(&mut cache));
        let mut last = self.logits(&hidden.select(1, max_len as i64 - 1));

        let mut outputs: Vec<Generation> = (0..b)
            .map(|_| Generation {
                token_ids: vec![],
                logprobs: vec![],
                finish_reason: FinishReason::Length,
            })
            .collect();
        let mut done = vec![false; b];
        for step in 0..params.max_new_tokens {
            let (tokens, logprobs) = sample(&last, params);
            let tokens_v = Vec::<i64>::try_from(tokens.to_device(tch::Device::Cpu))?;
            let logprobs_v = Vec::<f32>::try_from(logprobs.to_device(tch::Device::Cpu))?;
            for row in 0..b {
                if done[row] {
                    continue;
                }
                let tok = tokens_v[row] as u32;
                outputs[row].token_ids.push(tok);
                outputs[row].logprobs.push(logprobs_v[row]);
                if params.stop_token_ids.contains(&tok) {
                    outputs[row].finish_reason = FinishReason::Stop;
                    done[row] = true;
                }
            }
            if done.iter().all(|&d| d) || step + 1 == params.max_new_tokens {
                break;
            }
            // Rows that stopped keep decoding padding that nothing attends to.
            let live: Vec<bool> = done.iter().map(|d| !d).collect();
            let step_mask = Tensor::from_slice(&live)
                .view([b as i64, 1])
                .to_device(device);
            let hidden = self.forward(&tokens.unsqueeze(1), &step_mask, Some(&mut cache));
            last = self.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
        }
        Ok(outputs)
    }
}
