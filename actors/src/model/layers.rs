//! The building blocks of a Qwen2 / Qwen3 / Llama / Mistral decoder, written to match
//! `transformers` operation for operation (float32 RMSNorm, rotate-half rotary with its
//! scalings, Qwen3's per-head query/key norms, SwiGLU), which is what makes logits agree to
//! 1e-4.

use tch::nn;
use tch::{Kind, Tensor};

use super::config::{ModelConfig, RopeScaling};
use super::kv_cache::{KeyLengths, KvStore};
use super::lora::LoraAdapter;

/// Root-mean-square layer norm, computed in float32 as transformers does.
#[derive(Debug)]
pub(crate) struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub(crate) fn new(vs: nn::Path<'_>, size: i64, eps: f64) -> Self {
        Self {
            weight: vs.ones("weight", &[size]),
            eps,
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_to(x, x.kind())
    }

    /// The norm of `x` (in float32) rounded to `kind` before the weight is applied: with a
    /// float32 residual stream, `kind` is the precision the layer computes in.
    pub(crate) fn forward_to(&self, x: &Tensor, kind: Kind) -> Tensor {
        let xf = x.to_kind(Kind::Float);
        let variance = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let normed = (xf * (variance + self.eps).rsqrt()).to_kind(kind);
        &self.weight * normed
    }
}

/// Rotary position embedding (rotate-half form, as in transformers' Llama/Qwen2).
#[derive(Debug)]
pub(crate) struct Rotary {
    inv_freq: Tensor,
}

impl Rotary {
    pub(crate) fn new(config: &ModelConfig, device: tch::Device) -> Self {
        let d = config.head_dim as i64;
        let exponents = Tensor::arange_start_step(0, d, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / d as f64;
        let inv_freq = Tensor::from(config.rope_theta)
            .to_device(device)
            .to_kind(Kind::Float)
            .pow(&exponents)
            .reciprocal();
        let inv_freq = match config.rope_scaling {
            RopeScaling::Default => inv_freq,
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3_inv_freq(
                &inv_freq,
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings as f64,
            ),
        };
        Self { inv_freq }
    }

    /// cos and sin for positions [B, T], shaped [B, 1, T, D] to broadcast over heads.
    pub(crate) fn cos_sin(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (
            emb.cos().to_kind(kind).unsqueeze(1),
            emb.sin().to_kind(kind).unsqueeze(1),
        )
    }
}

/// Llama 3.1's frequency scaling, as transformers' `_compute_llama3_parameters` computes it
/// (float32, same operations in the same order): wavelengths longer than the original context
/// over `low_freq_factor` are stretched by `factor`, shorter than it over `high_freq_factor`
/// kept, and the band between blended smoothly.
fn llama3_inv_freq(inv_freq: &Tensor, factor: f64, low: f64, high: f64, original: f64) -> Tensor {
    let low_freq_wavelen = original / low;
    let high_freq_wavelen = original / high;
    let wavelen = inv_freq.reciprocal() * (2.0 * std::f64::consts::PI);
    let scaled = inv_freq.where_self(&wavelen.le(low_freq_wavelen), &(inv_freq / factor));
    let smooth = (wavelen.reciprocal() * original - low) / (high - low);
    let smoothed = (smooth.neg() + 1.0) * &scaled / factor + &smooth * &scaled;
    let medium = wavelen
        .ge(high_freq_wavelen)
        .logical_and(&wavelen.le(low_freq_wavelen));
    smoothed.where_self(&medium, &scaled)
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(&[&x2.neg(), &x1], -1)
}

fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

/// A projection `x W^T + b`, with a LoRA adapter computed beside it (never merged into `W`)
/// when one is attached.
#[derive(Debug)]
pub(crate) struct Proj {
    base: nn::Linear,
    pub(crate) adapter: Option<LoraAdapter>,
}

impl Proj {
    /// `x W^T + b` as one operation (`Module::forward` for `nn::Linear` adds the bias apart),
    /// plus the adapter's term.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.linear(&self.base.ws, self.base.bs.as_ref());
        match &self.adapter {
            Some(adapter) => adapter.add_to(y, x),
            None => y,
        }
    }

    /// The frozen weight `W` `[out, in]`.
    pub(crate) fn weight(&self) -> &Tensor {
        &self.base.ws
    }
}

fn linear(vs: nn::Path<'_>, inp: usize, out: usize, bias: bool, init: nn::Init) -> Proj {
    let config = nn::LinearConfig {
        ws_init: init,
        bs_init: bias.then_some(nn::Init::Const(0.0)),
        bias,
    };
    Proj {
        base: nn::linear(vs, inp as i64, out as i64, config),
        adapter: None,
    }
}

/// Which keys each query attends to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttnMask<'a> {
    /// An additive bias (0 attended, -inf not) in the queries' grouped order, made once per
    /// forward pass by [`attention_bias`] and shared by every layer.
    Bias(&'a Tensor),
    /// Causal over the chunk alone: exact for right-padded sequences without a cache (a real
    /// token never sees the padding after it), and no mask tensor exists, so attention
    /// runs in a fused kernel that keeps no `[T x S]` tensor for the backward pass.
    Causal,
    /// Keys by per-sequence lengths over the whole slot store (decode steps on a GPU): flash
    /// attention reads each row's used keys and nothing else, with shapes that do not change
    /// from step to step (which CUDA graphs need).
    Lengths(&'a KeyLengths),
}

/// The additive attention bias for a boolean mask `[B, 1, T, S]` (true = attended), laid out
/// for grouped-query attention: the `group` query heads that share a KV head attend as one
/// head with `group * T` query rows (see [`Attention::forward`]), so row `g * T + t` is row
/// `t`'s mask. Made once per forward pass: the fused kernel takes it as it is, where a
/// boolean mask would be repeated and converted in every layer.
///
/// On a GPU its rows are padded to a multiple of 16 keys in memory (a view of the first `S`
/// is returned), the alignment the memory-efficient kernel needs.
pub(crate) fn attention_bias(mask: &Tensor, group: i64, kind: Kind) -> Tensor {
    let mask = if group > 1 {
        mask.repeat([1, 1, group, 1])
    } else {
        mask.shallow_clone()
    };
    let mut size = mask.size();
    let keys = size[3];
    if mask.device().is_cuda() {
        size[3] = (keys + 15) / 16 * 16;
    }
    Tensor::zeros(size, (kind, mask.device()))
        .narrow(3, 0, keys)
        .masked_fill_(&mask.logical_not(), f64::NEG_INFINITY)
}

/// Grouped-query self-attention.
#[derive(Debug)]
pub(crate) struct Attention {
    q_proj: Proj,
    k_proj: Proj,
    v_proj: Proj,
    o_proj: Proj,
    /// Qwen3's RMSNorm over each head's queries and keys, before the rotary embedding.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    pub(crate) fn new(vs: nn::Path<'_>, c: &ModelConfig, init: nn::Init) -> Self {
        let q = c.num_attention_heads * c.head_dim;
        let kv = c.num_key_value_heads * c.head_dim;
        Self {
            q_proj: linear(&vs / "q_proj", c.hidden_size, q, c.qkv_bias, init),
            k_proj: linear(&vs / "k_proj", c.hidden_size, kv, c.qkv_bias, init),
            v_proj: linear(&vs / "v_proj", c.hidden_size, kv, c.qkv_bias, init),
            o_proj: linear(&vs / "o_proj", q, c.hidden_size, c.o_bias, init),
            qk_norm: c.qk_norm.then(|| {
                let d = c.head_dim as i64;
                (
                    RmsNorm::new(&vs / "q_norm", d, c.rms_norm_eps),
                    RmsNorm::new(&vs / "k_norm", d, c.rms_norm_eps),
                )
            }),
            heads: c.num_attention_heads as i64,
            kv_heads: c.num_key_value_heads as i64,
            head_dim: c.head_dim as i64,
        }
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: AttnMask<'_>,
        cache: Option<(&mut dyn KvStore, usize)>,
    ) -> Tensor {
        let (b, t, _) = x.size3().expect("hidden states are [B, T, H]");
        let heads = |y: Tensor, n: i64| y.view([b, t, n, self.head_dim]);
        let (q, k) = (
            heads(self.q_proj.forward(x), self.heads),
            heads(self.k_proj.forward(x), self.kv_heads),
        );
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (q_norm.forward(&q), k_norm.forward(&k)),
            None => (q, k),
        };
        let q = apply_rotary(&q.transpose(1, 2), cos, sin);
        let k = apply_rotary(&k.transpose(1, 2), cos, sin);
        let v = heads(self.v_proj.forward(x), self.kv_heads).transpose(1, 2);
        let (k, v) = match cache {
            Some((cache, layer)) => cache.append(layer, &k, &v),
            None => (k, v),
        };
        // Grouped-query attention without copying keys and values per query head: the
        // `group` query heads that share KV head j (heads j*group.., as repeat_interleave
        // would pair them) attend as one head with group*T query rows. Repeating the KV
        // instead would copy the whole cache every layer of every decode step.
        let group = self.heads / self.kv_heads;
        let out = match mask {
            AttnMask::Causal => Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<Tensor>,
                0.0,
                true,
                None,
                group > 1,
            ),
            AttnMask::Bias(bias) => Self::biased(&q, &k, &v, bias, group),
            AttnMask::Lengths(lengths) => Self::by_lengths(&q, &k, &v, lengths, group),
        };
        let out = out
            .transpose(1, 2)
            .reshape([b, t, self.heads * self.head_dim]);
        self.o_proj.forward(&out)
    }

    /// Attention under an additive bias from [`attention_bias`]: `q` `[B, heads, T, D]`,
    /// `k`/`v` `[B, kv_heads, S, D]`.
    fn biased(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, group: i64) -> Tensor {
        let (b, heads, t, d) = q.size4().expect("queries are [B, heads, T, D]");
        let grouped = q.reshape([b, heads / group, group * t, d]);
        let out = if q.device().is_cuda() {
            // Not `scaled_dot_product_attention`: on Hopper it picks cuDNN's kernel, which
            // builds an execution plan for every new shape, and a decode step's key count
            // grows by one every step (tens of milliseconds a step, measured on an H200).
            let bias = bias.expand([b, heads / group, group * t, k.size()[2]], false);
            Tensor::internal_scaled_dot_product_efficient_attention(
                &grouped,
                k,
                v,
                Some(&bias),
                false,
                0.0,
                false,
                None,
            )
            .0
        } else {
            Tensor::scaled_dot_product_attention(
                &grouped,
                k,
                v,
                Some(bias),
                0.0,
                false,
                None,
                false,
            )
        };
        out.reshape([b, heads, t, d])
    }

    /// Attention of one query token per row over the keys [`KeyLengths`] gives: `q` `[B,
    /// heads, 1, D]`, `k`/`v` the whole slot store `[B, kv_heads, slots, D]`.
    fn by_lengths(q: &Tensor, k: &Tensor, v: &Tensor, lengths: &KeyLengths, group: i64) -> Tensor {
        let (b, heads, t, d) = q.size4().expect("queries are [B, heads, T, D]");
        assert_eq!(
            t, 1,
            "attention by key lengths takes one query token per row"
        );
        let packed = |x: &Tensor| x.view([-1, 1, d]);
        crate::device::cuda::flash_varlen(
            &q.reshape([b * heads, 1, d]),
            &packed(k),
            &packed(v),
            &lengths.cu_q,
            &lengths.cu_k,
            &lengths.used,
            group,
            lengths.max_k,
            1.0 / (d as f64).sqrt(),
        )
        .view([b, heads, 1, d])
    }
}

/// SwiGLU feed-forward: down(silu(gate(x)) * up(x)).
#[derive(Debug)]
pub(crate) struct Mlp {
    gate_proj: Proj,
    up_proj: Proj,
    down_proj: Proj,
}

impl Mlp {
    pub(crate) fn new(vs: nn::Path<'_>, c: &ModelConfig, init: nn::Init) -> Self {
        Self {
            gate_proj: linear(
                &vs / "gate_proj",
                c.hidden_size,
                c.intermediate_size,
                c.mlp_bias,
                init,
            ),
            up_proj: linear(
                &vs / "up_proj",
                c.hidden_size,
                c.intermediate_size,
                c.mlp_bias,
                init,
            ),
            down_proj: linear(
                &vs / "down_proj",
                c.intermediate_size,
                c.hidden_size,
                c.mlp_bias,
                init,
            ),
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        let gate = self.gate_proj.forward(x).silu();
        self.down_proj.forward(&(gate * self.up_proj.forward(x)))
    }
}

/// One pre-norm decoder layer.
#[derive(Debug)]
pub(crate) struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// The layer's variables in `vs`, its projections filled by `init`.
    pub(crate) fn new(vs: nn::Path<'_>, c: &ModelConfig, init: nn::Init) -> Self {
        let h = c.hidden_size as i64;
        Self {
            input_layernorm: RmsNorm::new(&vs / "input_layernorm", h, c.rms_norm_eps),
            self_attn: Attention::new(&vs / "self_attn", c, init),
            post_attention_layernorm: RmsNorm::new(
                &vs / "post_attention_layernorm",
                h,
                c.rms_norm_eps,
            ),
            mlp: Mlp::new(&vs / "mlp", c, init),
        }
    }

    /// The layer's projections by their module names under the layer (`self_attn.q_proj`,
    /// `mlp.down_proj`, ...), in PEFT's order.
    pub(crate) fn projections(&self) -> [(&'static str, &Proj); 7] {
        let a = &self.self_attn;
        let m = &self.mlp;
        [
            ("self_attn.q_proj", &a.q_proj),
            ("self_attn.k_proj", &a.k_proj),
            ("self_attn.v_proj", &a.v_proj),
            ("self_attn.o_proj", &a.o_proj),
            ("mlp.gate_proj", &m.gate_proj),
            ("mlp.up_proj", &m.up_proj),
            ("mlp.down_proj", &m.down_proj),
        ]
    }

    /// [`DecoderLayer::projections`], mutably.
    pub(crate) fn projections_mut(&mut self) -> [(&'static str, &mut Proj); 7] {
        let a = &mut self.self_attn;
        let m = &mut self.mlp;
        [
            ("self_attn.q_proj", &mut a.q_proj),
            ("self_attn.k_proj", &mut a.k_proj),
            ("self_attn.v_proj", &mut a.v_proj),
            ("self_attn.o_proj", &mut a.o_proj),
            ("mlp.gate_proj", &mut m.gate_proj),
            ("mlp.up_proj", &mut m.up_proj),
            ("mlp.down_proj", &mut m.down_proj),
        ]
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: AttnMask<'_>,
        cache: Option<(&mut dyn KvStore, usize)>,
    ) -> Tensor {
        // The residual stream `x` may be float32 around reduced-precision layers (the
        // learner's); the layers compute in their weights' precision.
        let compute = self.input_layernorm.weight.kind();
        let attn = self.self_attn.forward(
            &self.input_layernorm.forward_to(x, compute),
            cos,
            sin,
            mask,
            cache,
        );
        let x = x + attn;
        let mlp = self
            .mlp
            .forward(&self.post_attention_layernorm.forward_to(&x, compute));
        x + mlp
    }
}
