"""The Kimi K3 text decoder in PyTorch, written from shared/spec/k3-architecture.md (§2 KDA, §3 MLA, §4 AttnRes,
§5 latent MoE / SiTU / router, §6-§7 the whole forward). Where the spec leaves a detail open this follows k3c's C
engine (src/cpu/*.c, src/stock/forward.c): q_a / kv_a RMSNorm eps 1e-6, the q/k L2 norm eps 1e-6 inside the
square root, Mix over [completed blocks ..., current prefix] with a single source passed through, router weights
from the uncorrected sigmoid scores divided by (sum + 1e-20).

Module and parameter names are the checkpoint's names without the "language_model." prefix, so the export is a
rename-free walk over state_dict() (plus MXFP4 packing of the routed experts and A_log padding).

KDA runs in the chunked form (spec §2.3) for training and in the token recurrence for checks; both in float32
whatever the autocast dtype. The chunk is 16 tokens: the decay inside a chunk is then at least exp(16 * -5), so
exp(+-cumulative decay) stays inside float32's range (e^80 < 3.4e38) and the intra-chunk products can be written
as matmuls of k * exp(gam) and k * exp(-gam) instead of a [C, C, dk] tensor of differences.
"""
import math
from dataclasses import dataclass, field, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

KDA_CHUNK = 16


@dataclass
class K3Config:
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 9
    full_attn_layers: list = field(default_factory=lambda: [4, 8, 9])  # 1-based, as config.json spells it
    attn_res_block_size: int = 4
    rms_norm_eps: float = 1e-5
    mla_lora_norm_eps: float = 1e-6
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    first_k_dense_replace: int = 1
    intermediate_size: int = 384
    num_experts: int = 16
    num_experts_per_token: int = 4
    num_shared_experts: int = 2
    moe_intermediate_size: int = 64
    routed_expert_hidden_size: int = 128
    routed_scaling_factor: float = 1.0
    kda_num_heads: int = 2
    kda_head_dim: int = 64
    kda_conv_kernel: int = 4
    kda_gate_lower_bound: float = -5.0
    num_attention_heads: int = 2
    q_lora_rank: int = 64
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 32
    v_head_dim: int = 32
    bos_token_id: int = 3840
    eos_token_id: int = 3842
    pad_token_id: int = 4095

    def is_mla(self, l):
        return (l + 1) in self.full_attn_layers

    def is_moe(self, l):
        return l >= self.first_k_dense_replace

    def to_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def situ(g, u, beta, beta_lin):
    """SiTU (spec §5.1): beta tanh(g / beta) sigmoid(g) * beta_lin tanh(u / beta_lin)."""
    lin = beta_lin * torch.tanh(u / beta_lin) if beta_lin else u
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * lin


def linear(i, o):
    return nn.Linear(i, o, bias=False)


# ---------------------------------------------------------------------------------------------------- KDA ----

def kda_recurrent(q, k, v, g, beta, state=None):
    """Token recurrence (spec §2.2 step 7, FLA naive_recurrent_kda). q (scaled), k: [B, T, H, dk]; v: [B, T, H, dv];
    g: [B, T, H, dk] log decay; beta: [B, T, H]. Returns o [B, T, H, dv] and the final state [B, H, dk, dv]."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    S = torch.zeros(B, H, dk, dv, dtype=q.dtype, device=q.device) if state is None else state
    out = []
    for t in range(T):
        S = S * torch.exp(g[:, t]).unsqueeze(-1)
        kt = k[:, t]
        u = beta[:, t].unsqueeze(-1) * (v[:, t] - torch.einsum("bhd,bhde->bhe", kt, S))
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)
        out.append(torch.einsum("bhd,bhde->bhe", q[:, t], S))
    return torch.stack(out, 1), S


def kda_chunked(q, k, v, g, beta, C=KDA_CHUNK):
    """Chunked form (spec §2.3), same shapes as kda_recurrent, zero initial state. Within a chunk every pairwise
    decay is exp(gam_i) * exp(-gam_j) with |gam| <= C * 5; across chunks the state follows the affine map
    S' = M S + Bc, M = Diag(exp(gam_C)) - K~^T W, Bc = K~^T U, one small matmul per chunk."""
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % C
    if pad:
        q, k, v, g = [F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g)]
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    # [B, H, N, C, d]
    r = lambda x: x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4)
    q, k, v, g = r(q), r(k), r(v), r(g)
    beta = beta.view(B, N, C, H).permute(0, 3, 1, 2)
    gam = torch.cumsum(g, dim=-2)
    eg, eng = torch.exp(gam), torch.exp(-gam)
    ke_pos, ke_neg = k * eg, k * eng
    qe = q * eg
    ones = torch.ones(C, C, dtype=torch.bool, device=q.device)
    strict = torch.tril(ones, -1)
    incl = torch.tril(ones)
    Akk = ke_pos @ ke_neg.transpose(-1, -2)  # [B,H,N,C,C]: sum_d k_i k_j exp(gam_i - gam_j)
    L = (beta.unsqueeze(-1) * Akk).masked_fill(~strict, 0.0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    # T = (I + L)^-1 Diag(beta): W = T (exp(gam) . K), U = T V
    Tm = torch.linalg.solve_triangular(eye + L, torch.diag_embed(beta), upper=False, unitriangular=True)
    W = Tm @ ke_pos
    U = Tm @ v
    Aqk = (qe @ ke_neg.transpose(-1, -2)).masked_fill(~incl, 0.0)
    gl = gam[..., -1:, :]  # [B,H,N,1,dk]
    kt = k * torch.exp(gl - gam)  # K . exp(gam_C - gam), <= |k|
    M = torch.diag_embed(torch.exp(gl.squeeze(-2))) - kt.transpose(-1, -2) @ W  # [B,H,N,dk,dk]
    Bc = kt.transpose(-1, -2) @ U  # [B,H,N,dk,dv]
    S = torch.zeros(B, H, dk, dv, dtype=q.dtype, device=q.device)
    states = []
    for n in range(N):
        states.append(S)
        S = M[:, :, n] @ S + Bc[:, :, n]
    Sn = torch.stack(states, 2)  # incoming state of every chunk
    Vp = U - W @ Sn
    O = qe @ Sn + Aqk @ Vp
    O = O.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, dv)
    return O[:, :T]


class KDA(nn.Module):
    def __init__(self, c: K3Config):
        super().__init__()
        D, H, dk, W = c.hidden_size, c.kda_num_heads, c.kda_head_dim, c.kda_conv_kernel
        P = H * dk
        self.H, self.dk, self.W, self.lb, self.eps = H, dk, W, c.kda_gate_lower_bound, c.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = linear(D, P), linear(D, P), linear(D, P)
        self.q_conv1d = nn.Conv1d(P, P, W, groups=P, bias=False)
        self.k_conv1d = nn.Conv1d(P, P, W, groups=P, bias=False)
        self.v_conv1d = nn.Conv1d(P, P, W, groups=P, bias=False)
        self.f_a_proj = linear(D, dk)  # low-rank decay input, rank = head_dim (K3: 128)
        self.f_b_proj = linear(dk, P)
        self.b_proj = linear(D, H)
        self.g_proj = linear(D, P)  # full-rank output gate
        self.A_log = nn.Parameter(torch.zeros(H))  # exported zero-padded to a multiple of 128
        self.dt_bias = nn.Parameter(torch.zeros(P))
        self.o_norm = RMSNorm(dk, c.rms_norm_eps)
        self.o_proj = linear(P, D)

    def conv(self, conv, x):
        # causal depthwise conv: tap W-1 multiplies the current token (spec §2.2 step 2), then SiLU
        T = x.shape[1]
        y = F.conv1d(x.transpose(1, 2), conv.weight, padding=self.W - 1, groups=conv.weight.shape[0])
        return F.silu(y[..., :T].transpose(1, 2))

    def forward(self, x, recurrent=False):
        B, T, _ = x.shape
        H, dk = self.H, self.dk
        q = self.conv(self.q_conv1d, self.q_proj(x))
        k = self.conv(self.k_conv1d, self.k_proj(x))
        v = self.conv(self.v_conv1d, self.v_proj(x))
        f = self.f_b_proj(self.f_a_proj(x))
        b = self.b_proj(x)
        z = self.g_proj(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k, v, f, b = q.float(), k.float(), v.float(), f.float(), b.float()
            q = q.view(B, T, H, dk)
            k = k.view(B, T, H, dk)
            v = v.view(B, T, H, dk)
            q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
            k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
            A = torch.exp(self.A_log.float()).view(1, 1, H, 1)
            g = self.lb * torch.sigmoid(A * (f.view(B, T, H, dk) + self.dt_bias.float().view(1, 1, H, dk)))
            beta = torch.sigmoid(b)
            if recurrent:
                o, _ = kda_recurrent(q, k, v, g, beta)
            else:
                o = kda_chunked(q, k, v, g, beta)
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.float()
            o = o * torch.sigmoid(z.float().view(B, T, H, dk))
        return self.o_proj(o.reshape(B, T, H * dk).to(x.dtype))


# ---------------------------------------------------------------------------------------------------- MLA ----

class MLA(nn.Module):
    def __init__(self, c: K3Config):
        super().__init__()
        D, Hm = c.hidden_size, c.num_attention_heads
        self.Hm, self.nope, self.rope, self.vh, self.kvl = Hm, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        qh = self.nope + self.rope
        self.q_a_proj = linear(D, c.q_lora_rank)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.mla_lora_norm_eps)
        self.q_b_proj = linear(c.q_lora_rank, Hm * qh)
        self.kv_a_proj_with_mqa = linear(D, c.kv_lora_rank + self.rope)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.mla_lora_norm_eps)
        self.kv_b_proj = linear(c.kv_lora_rank, Hm * (self.nope + self.vh))
        self.g_proj = linear(D, Hm * self.vh)
        self.o_proj = linear(Hm * self.vh, D)

    def forward(self, x, recurrent=False):
        B, T, _ = x.shape
        Hm, nope, rope, vh = self.Hm, self.nope, self.rope, self.vh
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, Hm, nope + rope)
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_pe = ckv[..., : self.kvl], ckv[..., self.kvl:]
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, Hm, nope + vh)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        k = torch.cat([k_nope, k_pe.unsqueeze(2).expand(B, T, Hm, rope)], -1)  # NoPE: k_pe shared, not rotated
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           scale=(nope + rope) ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, Hm * vh)
        o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


# ---------------------------------------------------------------------------------------------------- FFN ----

class MLP(nn.Module):
    def __init__(self, D, width, c):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(D, width), linear(D, width), linear(width, D)
        self.beta, self.beta_lin = c.situ_beta, c.situ_linear_beta

    def forward(self, y):
        return self.down_proj(situ(self.gate_proj(y), self.up_proj(y), self.beta, self.beta_lin))


class Router(nn.Module):
    """block_sparse_moe.gate: weight [E, D], e_score_correction_bias [E] (a buffer: moved by the load-balance
    rule, not by gradients)."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(c.num_experts, c.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(c.num_experts))


class Experts(nn.Module):
    """The routed experts stacked: w1 (gate) [E, F, R], w2 (down) [E, R, F], w3 (up) [E, F, R]. `quant` set to a
    function maps a weight to its MXFP4 fake-quantized value (straight-through) for QAT or PTQ evaluation."""

    def __init__(self, c):
        super().__init__()
        E, Fi, R = c.num_experts, c.moe_intermediate_size, c.routed_expert_hidden_size
        self.w1 = nn.Parameter(torch.zeros(E, Fi, R))
        self.w2 = nn.Parameter(torch.zeros(E, R, Fi))
        self.w3 = nn.Parameter(torch.zeros(E, Fi, R))
        self.quant = None

    def weights(self):
        if self.quant is None:
            return self.w1, self.w2, self.w3
        return self.quant(self.w1), self.quant(self.w2), self.quant(self.w3)


class LatentMoE(nn.Module):
    def __init__(self, c: K3Config):
        super().__init__()
        D, R = c.hidden_size, c.routed_expert_hidden_size
        self.c = c
        self.gate = Router(c)
        self.routed_expert_down_proj = linear(D, R)
        self.routed_expert_norm = RMSNorm(R, c.rms_norm_eps)
        self.routed_expert_up_proj = linear(R, D)
        self.shared_experts = MLP(D, c.num_shared_experts * c.moe_intermediate_size, c)
        self.experts = Experts(c)
        self.last_load = None  # [E] fraction of (token, slot) pairs per expert in the last training forward

    def route(self, y):
        c = self.c
        with torch.autocast(device_type=y.device.type, enabled=False):
            logits = y.float() @ self.gate.weight.float().t()  # fp32 router (spec §5.3)
            s = torch.sigmoid(logits)
            sel = s + self.gate.e_score_correction_bias.float()
            idx = torch.topk(sel, c.num_experts_per_token, dim=-1).indices
            w = torch.gather(s, -1, idx)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        return idx, w

    def forward(self, y):
        c = self.c
        B, T, D = y.shape
        yf = y.reshape(B * T, D)
        idx, w = self.route(yf)
        E = c.num_experts
        dense_w = torch.zeros(B * T, E, dtype=w.dtype, device=w.device).scatter(1, idx, w)
        if self.training:
            self.last_load = torch.zeros(E, device=y.device).scatter_add_(
                0, idx.reshape(-1), torch.ones(idx.numel(), device=y.device)) / idx.numel()
        z = self.routed_expert_down_proj(yf)  # [N, R]
        w1, w2, w3 = self.experts.weights()
        # Every expert on every token, weighted by dense_w (0 off the top-k): the same sum as the sparse form,
        # cheaper than gathering at this size (16 experts, widths 64 / 128).
        h = situ(torch.einsum("nr,efr->enf", z, w1.to(z.dtype)), torch.einsum("nr,efr->enf", z, w3.to(z.dtype)),
                 c.situ_beta, c.situ_linear_beta)
        out = torch.einsum("enf,erf->enr", h, w2.to(h.dtype))
        r = torch.einsum("enr,ne->nr", out, dense_w.to(out.dtype))
        r = self.routed_expert_norm(r)
        r = self.routed_expert_up_proj(r)
        return (r + self.shared_experts(yf)).view(B, T, D)


# ------------------------------------------------------------------------------------------------ AttnRes ----

def attnres_mix(sources, proj, norm, eps):
    """Mix (spec §4.2): softmax over sources of dot(RMSNorm_norm(v_j), proj), applied to the raw sources."""
    if len(sources) == 1:
        return sources[0]
    V = torch.stack(sources, 0)  # [n, B, T, D]
    Vf = V.float()
    r = torch.rsqrt(Vf.pow(2).mean(-1) + eps)
    s = (Vf * (norm.float() * proj.float().view(-1))).sum(-1) * r
    a = torch.softmax(s, dim=0).to(V.dtype)
    return (a.unsqueeze(-1) * V).sum(0)


class Layer(nn.Module):
    def __init__(self, c: K3Config, l):
        super().__init__()
        D = c.hidden_size
        self.l, self.eps = l, c.rms_norm_eps
        self.input_layernorm = RMSNorm(D, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(D, c.rms_norm_eps)
        self.self_attention_res_proj = linear(D, 1)
        self.self_attention_res_norm = RMSNorm(D, c.rms_norm_eps)
        self.mlp_res_proj = linear(D, 1)
        self.mlp_res_norm = RMSNorm(D, c.rms_norm_eps)
        self.self_attn = MLA(c) if c.is_mla(l) else KDA(c)
        if c.is_moe(l):
            self.block_sparse_moe = LatentMoE(c)
        else:
            self.mlp = MLP(D, c.intermediate_size, c)

    def ffn(self, y):
        return self.block_sparse_moe(y) if hasattr(self, "block_sparse_moe") else self.mlp(y)


class Inner(nn.Module):
    def __init__(self, c: K3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c, l) for l in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.output_attn_res_proj = linear(c.hidden_size, 1)
        self.output_attn_res_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class K3(nn.Module):
    def __init__(self, c: K3Config, dropout=0.0):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = linear(c.hidden_size, c.vocab_size)
        self.dropout = dropout

    def hidden(self, ids, recurrent=False):
        """The pre-norm h_final of spec §7 for ids [B, T]."""
        c, m = self.c, self.model
        eps = c.rms_norm_eps
        drop = lambda x: F.dropout(x, self.dropout, self.training) if self.dropout else x
        P = m.embed_tokens(ids).float()  # the stream stays float32 under autocast
        blocks = []
        for lw in m.layers:
            l = lw.l
            a_in = attnres_mix(blocks + [P], lw.self_attention_res_proj.weight, lw.self_attention_res_norm.weight, eps)
            empty = False
            if l % c.attn_res_block_size == 0:
                blocks.append(P)
                empty = True
            A = drop(lw.self_attn(lw.input_layernorm(a_in), recurrent=recurrent).float())
            P = A if empty else P + A
            m_in = attnres_mix(blocks + [P], lw.mlp_res_proj.weight, lw.mlp_res_norm.weight, eps)
            P = P + drop(lw.ffn(lw.post_attention_layernorm(m_in)).float())
        return attnres_mix(blocks + [P], m.output_attn_res_proj.weight, m.output_attn_res_norm.weight, eps)

    def forward(self, ids, recurrent=False):
        h = self.hidden(ids, recurrent=recurrent)
        return self.lm_head(self.model.norm(h))

    def moe_layers(self):
        return [lw.block_sparse_moe for lw in self.model.layers if hasattr(lw, "block_sparse_moe")]

    @torch.no_grad()
    def update_router_bias(self, rate):
        """Auxiliary-loss-free balancing (the noaux_tc selection bias): raise the bias of under-loaded experts,
        lower it for over-loaded ones, by `rate` per step."""
        for moe in self.moe_layers():
            if moe.last_load is None:
                continue
            b = moe.gate.e_score_correction_bias
            b += rate * torch.sign(moe.last_load.mean() - moe.last_load)

    def init_weights(self, seed):
        """Scaled so hidden states keep unit RMS: inputs N(0, 1/fan_in), projections that write into the stream
        at half gain, zero AttnRes pseudo-queries (uniform depth mixing at the start), decays spread from
        fast to slow heads."""
        g = torch.Generator().manual_seed(seed)
        c = self.c

        def normal_(t, std):
            with torch.no_grad():
                t.copy_(torch.randn(t.shape, generator=g) * std)

        for name, p in self.named_parameters():
            leaf = name.split(".")[-1]
            if name.endswith("embed_tokens.weight"):
                normal_(p, 1.0)
            elif name.endswith("_res_proj.weight"):
                with torch.no_grad():
                    p.zero_()
            elif "norm" in name.split(".")[-2] and leaf == "weight":
                with torch.no_grad():
                    p.fill_(1.0)
            elif "conv1d" in name:
                with torch.no_grad():
                    p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / math.sqrt(c.kda_conv_kernel))
            elif leaf == "A_log":
                with torch.no_grad():
                    p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=g)))
            elif leaf == "dt_bias":
                normal_(p, 0.5)
                with torch.no_grad():
                    p.add_(-2.0)
            elif leaf in ("w1", "w3"):
                normal_(p, 1 / math.sqrt(p.shape[-1]))
            elif leaf == "w2":
                normal_(p, 1 / math.sqrt(p.shape[-1]))
            elif name == "lm_head.weight":
                normal_(p, 0.25 / math.sqrt(p.shape[1]))  # small initial logits: loss starts near ln(vocab)
            elif p.dim() == 2:
                fan_in = p.shape[1]
                out_proj = any(s in name for s in ("o_proj", "down_proj", "routed_expert_up_proj"))
                normal_(p, (0.5 if out_proj else 1.0) / math.sqrt(fan_in))
            else:
                raise ValueError("no init rule for %s" % name)
        for moe in self.moe_layers():
            moe.gate.e_score_correction_bias.zero_()


def count_params(model):
    c = model.c
    total = sum(p.numel() for p in model.parameters())
    experts = sum(m.experts.w1.numel() + m.experts.w2.numel() + m.experts.w3.numel() for m in model.moe_layers())
    emb = model.model.embed_tokens.weight.numel()
    active = total - emb - experts + experts * c.num_experts_per_token // c.num_experts
    return {"total": total, "routed_experts": experts, "embedding": emb, "active_per_token_no_embedding": active}
