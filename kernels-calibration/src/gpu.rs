//! Running one transformer layer's kernels on an NVIDIA GPU and timing them with CUDA
//! events (cudarc: driver, cuBLAS, NVRTC; libraries loaded at run time).
//!
//! Per layer with tensor parallelism t (heads, KV heads and MLP width divided by t), bf16
//! tensors, for the `N` tokens of a measurement:
//! * linear group: RMSNorm, QKV GEMM `[N,h]x[h,(nh+2nkv)d]`, RoPE, O GEMM `[N,nh d]x[nh d,h]`,
//!   residual add, RMSNorm, gate/up GEMM `[N,h]x[h,2f]`, SiLU-and-multiply, down GEMM
//!   `[N,f]x[f,h]`, residual add;
//! * attention groups: appending each row's K and V to its sequence's cache, then attention
//!   of every query row over its visible keys (decode: the whole context; prefill chunk:
//!   causal over cached + earlier chunk tokens);
//! * composite: both, as a layer runs a mixed batch.
//!
//! A measurement is warmed up, then timed `repeats` times between two CUDA events on the
//! stream; the median is the sample.
#![allow(unsafe_code)]

use crate::kernels;
use crate::plan::{Measurement, PlanLimits};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg, sys,
};
use half::bf16;
use infersched_cost_model::ModelSpec;
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// Why the GPU cannot be used.
#[derive(Debug, Error)]
pub enum GpuError {
    /// libcuda is not loadable: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded): calibration needs an NVIDIA GPU and its driver; everything else in infersched works without one"
    )]
    NoDriver,
    /// A CUDA library other than the driver is missing.
    #[error(
        "{0} could not be loaded: install the CUDA toolkit libraries and put their directory (e.g. /usr/local/cuda/lib64, never lib64/stubs) on LD_LIBRARY_PATH"
    )]
    MissingLibrary(&'static str),
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The model does not fit the calibration shapes.
    #[error("model: {0}")]
    Shape(String),
}

fn cuda<E: std::fmt::Debug>(e: E) -> GpuError {
    GpuError::Cuda(format!("{e:?}"))
}

/// What the GPU and its software are.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// Device name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Driver's CUDA version, e.g. 13000.
    pub driver_cuda_version: i32,
    /// NVRTC version (major, minor).
    pub nvrtc_version: (i32, i32),
}

/// Checks that the CUDA driver, cuBLAS and NVRTC load, without creating a context when
/// they do not (cudarc panics on a missing library otherwise).
pub fn check_libraries() -> Result<(), GpuError> {
    // SAFETY: each call only tries to dlopen the library and reports whether it loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err(GpuError::MissingLibrary("cuBLAS (libcublas)"));
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::MissingLibrary("NVRTC (libnvrtc)"));
    }
    Ok(())
}

/// Opens GPU `ordinal` and describes it.
pub fn probe(ordinal: usize) -> Result<(Arc<CudaContext>, GpuInfo), GpuError> {
    check_libraries()?;
    let ctx = CudaContext::new(ordinal).map_err(cuda)?;
    let mut driver = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver) }
        .result()
        .map_err(cuda)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints through valid pointers.
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let info = GpuInfo {
        name: ctx.name().map_err(cuda)?,
        compute_capability: ctx.compute_capability().map_err(cuda)?,
        memory_bytes: ctx.total_mem().map_err(cuda)? as u64,
        driver_cuda_version: driver,
        nvrtc_version: (major, minor),
    };
    Ok((ctx, info))
}

/// Per-GPU shapes of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerShape {
    /// Hidden size.
    pub h: usize,
    /// Query heads on this GPU.
    pub nh: usize,
    /// KV heads on this GPU.
    pub nkv: usize,
    /// Head dimension.
    pub d: usize,
    /// MLP width on this GPU.
    pub f: usize,
}

impl LayerShape {
    /// The shapes of `model` split over `tp` GPUs.
    pub fn of(model: &ModelSpec, tp: u32) -> Result<Self, GpuError> {
        let t = tp.max(1) as usize;
        let (heads, kv_heads) = (model.heads as usize, model.kv_heads as usize);
        if !heads.is_multiple_of(t) || !(model.mlp_hidden as usize).is_multiple_of(t) {
            return Err(GpuError::Shape(format!(
                "{} heads and MLP width {} must divide by TP {t}",
                heads, model.mlp_hidden
            )));
        }
        let nh = heads / t;
        let nkv = (kv_heads / t).max(1);
        if !nh.is_multiple_of(nkv) {
            return Err(GpuError::Shape(format!(
                "{nh} heads per GPU are not a multiple of {nkv} KV heads"
            )));
        }
        Ok(Self {
            h: model.hidden as usize,
            nh,
            nkv,
            d: model.head_dim as usize,
            f: model.mlp_hidden as usize / t,
        })
    }

    fn qkv_width(&self) -> usize {
        (self.nh + 2 * self.nkv) * self.d
    }
}

/// Device buffers and kernels for timing one layer.
pub struct LayerRunner {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<&'static str, CudaFunction>,
    shape: LayerShape,
    max_tokens: usize,
    max_context: usize,
    w_qkv: CudaSlice<bf16>,
    w_o: CudaSlice<bf16>,
    w_gu: CudaSlice<bf16>,
    w_down: CudaSlice<bf16>,
    w_norm: CudaSlice<bf16>,
    x: CudaSlice<bf16>,
    xn: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    proj: CudaSlice<bf16>,
    gu: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    k_cache: CudaSlice<bf16>,
    v_cache: CudaSlice<bf16>,
}

/// Row metadata of an attention step, on the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttentionRows {
    /// Sequence of each query row.
    pub seq_of: Vec<i32>,
    /// Position of each row's token in its sequence.
    pub pos: Vec<i32>,
    /// Keys each row sees (causal).
    pub visible: Vec<i32>,
    /// First cache slot of each sequence.
    pub kv_start: Vec<i64>,
}

/// The attention rows of a measurement: prefill chunks first (token `m + i` of a chunk
/// sees `m + i + 1` keys), then decodes (the new token sees the whole context).
pub fn attention_rows(m: &Measurement) -> AttentionRows {
    let (chunks, decodes): (Vec<(u32, u32)>, Vec<u32>) = match m {
        Measurement::Linear { .. } => (vec![], vec![]),
        Measurement::DecodeAttention { contexts } => (vec![], contexts.clone()),
        Measurement::PrefillAttention { chunks } => (chunks.clone(), vec![]),
        Measurement::Composite { prefills, decodes } => (prefills.clone(), decodes.clone()),
    };
    let mut r = AttentionRows::default();
    let mut start = 0i64;
    for (s, &(c, before)) in chunks.iter().enumerate() {
        r.kv_start.push(start);
        for i in 0..c {
            r.seq_of.push(s as i32);
            r.pos.push((before + i) as i32);
            r.visible.push((before + i + 1) as i32);
        }
        start += i64::from(before + c);
    }
    for (k, &l) in decodes.iter().enumerate() {
        r.kv_start.push(start);
        r.seq_of.push((chunks.len() + k) as i32);
        r.pos.push(l as i32 - 1);
        r.visible.push(l as i32);
        start += i64::from(l);
    }
    r
}

fn blocks(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads).max(1) as u32
}

impl LayerRunner {
    /// Compiles the kernels and allocates weights, activations for `limits.max_tokens`
    /// tokens and a KV cache of `limits.max_kv_tokens` tokens.
    pub fn new(
        ctx: &Arc<CudaContext>,
        model: &ModelSpec,
        tp: u32,
        limits: &PlanLimits,
    ) -> Result<Self, GpuError> {
        let shape = LayerShape::of(model, tp)?;
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(cuda)?;
        let ptx = cudarc::nvrtc::compile_ptx(kernels::SOURCE).map_err(cuda)?;
        let module = ctx.load_module(ptx).map_err(cuda)?;
        let mut funcs = HashMap::new();
        for name in kernels::ENTRY_POINTS {
            funcs.insert(*name, module.load_function(name).map_err(cuda)?);
        }
        let n = limits.max_tokens as usize;
        let kv = limits.max_kv_tokens as usize * shape.nkv * shape.d;
        let LayerShape { h, nh, d, f, .. } = shape;
        let alloc = |len: usize| stream.alloc_zeros::<bf16>(len).map_err(cuda);
        // Weights: small constant values (timing does not depend on them).
        let weights = |len: usize| {
            stream
                .clone_htod(&vec![bf16::from_f32(0.01); len])
                .map_err(cuda)
        };
        Ok(Self {
            w_qkv: weights(h * shape.qkv_width())?,
            w_o: weights(nh * d * h)?,
            w_gu: weights(h * 2 * f)?,
            w_down: weights(f * h)?,
            w_norm: weights(h)?,
            x: weights(n * h)?,
            xn: alloc(n * h)?,
            qkv: alloc(n * shape.qkv_width())?,
            attn: alloc(n * nh * d)?,
            proj: alloc(n * h)?,
            gu: alloc(n * 2 * f)?,
            act: alloc(n * f)?,
            k_cache: alloc(kv.max(1))?,
            v_cache: alloc(kv.max(1))?,
            stream,
            blas,
            funcs,
            shape,
            max_tokens: n,
            max_context: limits.max_context as usize,
        })
    }

    /// Row-major `c[rows, out] = a[rows, inner] x w[inner, out]` with cuBLAS (column-major:
    /// `c^T = w^T a^T`).
    fn gemm(
        blas: &CudaBlas,
        a: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        c: &mut CudaSlice<bf16>,
        rows: usize,
        inner: usize,
        out: usize,
    ) -> Result<(), GpuError> {
        let cfg = GemmConfig {
            transa: blas_sys::cublasOperation_t::CUBLAS_OP_N,
            transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
            m: out as i32,
            n: rows as i32,
            k: inner as i32,
            alpha: bf16::ONE,
            lda: out as i32,
            ldb: inner as i32,
            beta: bf16::ZERO,
            ldc: out as i32,
        };
        // SAFETY: w holds inner x out, a holds at least rows x inner and c rows x out
        // elements (buffers are sized for max_tokens rows, checked by the caller).
        unsafe { blas.gemm(cfg, w, a, c) }.map_err(cuda)
    }

    fn launch_rmsnorm(&mut self, rows: usize) -> Result<(), GpuError> {
        let (rows_i, h) = (rows as i32, self.shape.h as i32);
        let f = &self.funcs["rmsnorm"];
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&self.x)
            .arg(&self.w_norm)
            .arg(&mut self.xn)
            .arg(&rows_i)
            .arg(&h);
        // SAFETY: x and xn hold rows x h bf16 values, w_norm h; one block per row.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    fn linear(&mut self, rows: usize, meta: &DeviceRows) -> Result<(), GpuError> {
        let s = self.shape;
        self.launch_rmsnorm(rows)?;
        Self::gemm(
            &self.blas,
            &self.xn,
            &self.w_qkv,
            &mut self.qkv,
            rows,
            s.h,
            s.qkv_width(),
        )?;
        {
            let (r, nh, nkv, d) = (rows as i32, s.nh as i32, s.nkv as i32, s.d as i32);
            let pairs = rows * (s.nh + s.nkv) * (s.d / 2);
            let cfg = LaunchConfig {
                grid_dim: (blocks(pairs, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.funcs["rope"]);
            b.arg(&mut self.qkv)
                .arg(&meta.pos)
                .arg(&r)
                .arg(&nh)
                .arg(&nkv)
                .arg(&d);
            // SAFETY: qkv holds rows x (nh + 2 nkv) d values, pos holds rows ints.
            unsafe { b.launch(cfg) }.map_err(cuda)?;
        }
        Self::gemm(
            &self.blas,
            &self.attn,
            &self.w_o,
            &mut self.proj,
            rows,
            s.nh * s.d,
            s.h,
        )?;
        self.residual(rows * s.h)?;
        self.launch_rmsnorm(rows)?;
        Self::gemm(
            &self.blas,
            &self.xn,
            &self.w_gu,
            &mut self.gu,
            rows,
            s.h,
            2 * s.f,
        )?;
        {
            let (r, f) = (rows as i32, s.f as i32);
            let cfg = LaunchConfig {
                grid_dim: (blocks(rows * s.f, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.funcs["silu_mul"]);
            b.arg(&self.gu).arg(&mut self.act).arg(&r).arg(&f);
            // SAFETY: gu holds rows x 2f, act rows x f values.
            unsafe { b.launch(cfg) }.map_err(cuda)?;
        }
        Self::gemm(
            &self.blas,
            &self.act,
            &self.w_down,
            &mut self.proj,
            rows,
            s.f,
            s.h,
        )?;
        self.residual(rows * s.h)
    }

    fn residual(&mut self, n: usize) -> Result<(), GpuError> {
        let n_i = n as i64;
        let cfg = LaunchConfig {
            grid_dim: (blocks(n, 256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.funcs["residual_add"]);
        b.arg(&mut self.x).arg(&self.proj).arg(&n_i);
        // SAFETY: x and proj hold at least n values.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    fn attention(&mut self, rows: usize, meta: &DeviceRows) -> Result<(), GpuError> {
        let s = self.shape;
        let (r, nh, nkv, d) = (rows as i32, s.nh as i32, s.nkv as i32, s.d as i32);
        let per_row = rows * s.nkv * s.d;
        let cfg = LaunchConfig {
            grid_dim: (blocks(per_row, 256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.funcs["kv_append"]);
        b.arg(&self.qkv)
            .arg(&mut self.k_cache)
            .arg(&mut self.v_cache)
            .arg(&meta.seq_of)
            .arg(&meta.pos)
            .arg(&meta.kv_start)
            .arg(&r)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d);
        // SAFETY: every (kv_start + pos) slot is inside the cache (checked when the rows
        // were built), qkv holds rows x (nh + 2 nkv) d values.
        unsafe { b.launch(cfg) }.map_err(cuda)?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, s.nh as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (meta.max_visible * 4) as u32,
        };
        let mut b = self.stream.launch_builder(&self.funcs["attention"]);
        b.arg(&self.qkv)
            .arg(&self.k_cache)
            .arg(&self.v_cache)
            .arg(&meta.seq_of)
            .arg(&meta.visible)
            .arg(&meta.kv_start)
            .arg(&mut self.attn)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d);
        // SAFETY: shared memory holds max_visible scores; reads stay inside each
        // sequence's cache slots and the qkv rows.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    fn upload(&self, rows: &AttentionRows, tokens: usize) -> Result<DeviceRows, GpuError> {
        // Linear-only measurements still need positions for RoPE.
        let pos: Vec<i32> = if rows.pos.is_empty() {
            (0..tokens as i32).collect()
        } else {
            rows.pos.clone()
        };
        let nonempty_i32 = |v: &[i32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        let nonempty_i64 = |v: &[i64]| if v.is_empty() { vec![0] } else { v.to_vec() };
        Ok(DeviceRows {
            seq_of: self
                .stream
                .clone_htod(&nonempty_i32(&rows.seq_of))
                .map_err(cuda)?,
            pos: self.stream.clone_htod(&pos).map_err(cuda)?,
            visible: self
                .stream
                .clone_htod(&nonempty_i32(&rows.visible))
                .map_err(cuda)?,
            kv_start: self
                .stream
                .clone_htod(&nonempty_i64(&rows.kv_start))
                .map_err(cuda)?,
            max_visible: rows.visible.iter().copied().max().unwrap_or(0).max(0) as usize,
        })
    }

    /// Runs `m` once (enqueued on the stream).
    fn run_once(&mut self, m: &Measurement, meta: &DeviceRows) -> Result<(), GpuError> {
        let rows = m.tokens() as usize;
        match m {
            Measurement::Linear { .. } => self.linear(rows, meta),
            Measurement::DecodeAttention { .. } | Measurement::PrefillAttention { .. } => {
                self.attention(rows, meta)
            }
            Measurement::Composite { .. } => {
                // A layer: norm + QKV + RoPE, attention, then the rest of the linear part.
                self.attention(rows, meta)?;
                self.linear(rows, meta)
            }
        }
    }

    /// Median milliseconds of `m` over `repeats` timed runs after `warmup` runs.
    pub fn time(
        &mut self,
        m: &Measurement,
        warmup: usize,
        repeats: usize,
    ) -> Result<f64, GpuError> {
        let rows = m.tokens() as usize;
        if rows == 0 || rows > self.max_tokens {
            return Err(GpuError::Shape(format!(
                "{rows} tokens, outside 1..={}",
                self.max_tokens
            )));
        }
        let attn = attention_rows(m);
        let kv_end = attn.kv_start.last().copied().unwrap_or(0)
            + attn.visible.last().copied().unwrap_or(0) as i64;
        if kv_end as u64 > (self.k_cache.len() / (self.shape.nkv * self.shape.d)) as u64
            || attn.visible.iter().any(|&v| v as usize > self.max_context)
        {
            return Err(GpuError::Shape(format!(
                "the measurement needs {kv_end} KV tokens or a context over {}",
                self.max_context
            )));
        }
        let meta = self.upload(&attn, rows)?;
        for _ in 0..warmup {
            self.run_once(m, &meta)?;
        }
        let ctx = self.stream.context().clone();
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats.max(1) {
            let start = ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda)?;
            let end = ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda)?;
            start.record(&self.stream).map_err(cuda)?;
            self.run_once(m, &meta)?;
            end.record(&self.stream).map_err(cuda)?;
            times.push(f64::from(start.elapsed_ms(&end).map_err(cuda)?));
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}

/// Row metadata on the device.
struct DeviceRows {
    seq_of: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    visible: CudaSlice<i32>,
    kv_start: CudaSlice<i64>,
    max_visible: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_rows_are_causal_and_slots_do_not_overlap() {
        let m = Measurement::Composite {
            prefills: vec![(3, 2), (2, 0)],
            decodes: vec![4, 1],
        };
        let r = attention_rows(&m);
        assert_eq!(r.seq_of, vec![0, 0, 0, 1, 1, 2, 3]);
        assert_eq!(r.pos, vec![2, 3, 4, 0, 1, 3, 0]);
        assert_eq!(r.visible, vec![3, 4, 5, 1, 2, 4, 1]);
        assert_eq!(r.kv_start, vec![0, 5, 7, 11]);
        assert_eq!(r.seq_of.len() as u32, m.tokens());
        // The last slot used is inside the KV the measurement declares.
        assert_eq!(11 + 1, m.kv_tokens() as i64);
    }

    #[test]
    fn shapes_split_over_tensor_parallel_gpus() {
        let s = LayerShape::of(&ModelSpec::llama3_70b(), 4).unwrap();
        assert_eq!((s.h, s.nh, s.nkv, s.d, s.f), (8192, 16, 2, 128, 7168));
        assert!(LayerShape::of(&ModelSpec::llama2_7b(), 3).is_err());
    }

    #[test]
    fn a_missing_library_is_an_error_that_says_what_to_do() {
        // No panic whether or not CUDA is installed; without it the error names the fix.
        if let Err(e) = check_libraries() {
            let text = e.to_string();
            assert!(
                text.contains("no CUDA driver found") || text.contains("LD_LIBRARY_PATH"),
                "{text}"
            );
        }
    }
}
