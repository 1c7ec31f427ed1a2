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
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// Why the GPU cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// libcuda is not loadable: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded): calibrate and replay --on-gpu need an NVIDIA GPU and its driver; everything else in infersched works without one"
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
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Peak SM clock in MHz, as the driver reports it.
    pub sm_clock_mhz: u32,
    /// Peak memory clock in MHz, as the driver reports it.
    pub memory_clock_mhz: u32,
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
    let attr = |a: sys::CUdevice_attribute| -> Result<u32, GpuError> {
        Ok(ctx.attribute(a).map_err(cuda)?.max(0) as u32)
    };
    use sys::CUdevice_attribute as A;
    let info = GpuInfo {
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        sm_clock_mhz: attr(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000,
        memory_clock_mhz: attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000,
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

/// One batch's times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchTiming {
    /// Milliseconds between the CUDA events around the batch's layers.
    pub gpu_ms: f64,
    /// Milliseconds the host took to enqueue them.
    pub issue_ms: f64,
    /// Milliseconds the GPU was kept waiting before the batch (at its peak clock; 0: the
    /// batch started on an idle GPU). The events time the GPU's work alone when the host
    /// enqueued the batch within this wait (`issue_ms < ahead_ms`).
    pub ahead_ms: f64,
}

/// Device buffers and kernels for timing one layer.
pub struct LayerRunner {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<&'static str, CudaFunction>,
    shape: LayerShape,
    max_tokens: usize,
    max_context: usize,
    cache_blocks: usize,
    max_parts: usize,
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
    partial: CudaSlice<f32>,
}

/// Row metadata of an attention step, on the host: which sequence and position each query
/// row is, the paged cache's block table, the prefill tiles and the decode partitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttentionRows {
    /// Sequence of each query row.
    pub seq_of: Vec<i32>,
    /// Position of each row's token in its sequence.
    pub pos: Vec<i32>,
    /// Keys each row sees (causal).
    pub visible: Vec<i32>,
    /// Tokens in each sequence's cache after the step.
    pub seq_len: Vec<i32>,
    /// First row of each sequence (a decode sequence has one row).
    pub seq_row: Vec<i32>,
    /// First block-table entry of each sequence.
    pub bt_start: Vec<i32>,
    /// Physical block of each logical block, all sequences back to back.
    pub block_table: Vec<i32>,
    /// Prefill tiles: `[sequence, first row, rows, first position]`, at most
    /// [`kernels::PREFILL_TILE_ROWS`] rows each.
    pub tiles: Vec<[i32; 4]>,
    /// Index of the first decode sequence (prefill sequences come first).
    pub first_decode_seq: usize,
    /// Decode partitions: `[sequence, first key, end key]`, at most
    /// [`kernels::DECODE_PARTITION`] keys each.
    pub parts: Vec<[i32; 3]>,
    /// Per decode sequence, its first partition and how many it has.
    pub seq_parts: Vec<[i32; 2]>,
}

impl AttentionRows {
    /// Logical blocks the cache holds for this step.
    pub fn blocks(&self) -> usize {
        self.block_table.len()
    }
}

/// The attention rows of a measurement: prefill chunks first (token `m + i` of a chunk
/// sees `m + i + 1` keys), then decodes (the new token sees the whole context). Physical
/// blocks are a seeded shuffle of `0..blocks`, so a sequence's blocks are scattered over the
/// cache as a paged allocator leaves them.
pub fn attention_rows(m: &Measurement) -> AttentionRows {
    let (chunks, decodes): (Vec<(u32, u32)>, Vec<u32>) = match m {
        Measurement::Linear { .. } => (vec![], vec![]),
        Measurement::DecodeAttention { contexts } => (vec![], contexts.clone()),
        Measurement::PrefillAttention { chunks } => (chunks.clone(), vec![]),
        Measurement::Composite { prefills, decodes } => (prefills.clone(), decodes.clone()),
    };
    let mut r = logical_rows(&chunks, &decodes);
    r.block_table.shuffle(&mut ChaCha8Rng::seed_from_u64(0));
    r
}

/// The attention rows of prefill `chunks` (`(c, m_before)`) then `decodes` (context after
/// the step) with logical blocks: sequence `s` holds block-table entries
/// `bt_start[s]..` numbered `0..blocks` in order (a caller maps them to physical blocks).
pub fn logical_rows(chunks: &[(u32, u32)], decodes: &[u32]) -> AttentionRows {
    let bs = kernels::BLOCK_SIZE as i32;
    let mut r = AttentionRows::default();
    let mut blocks = 0i32;
    let mut new_seq = |r: &mut AttentionRows, len: i32, row: i32| {
        r.seq_len.push(len);
        r.seq_row.push(row);
        r.bt_start.push(blocks);
        blocks += (len + bs - 1) / bs;
    };
    for (s, &(c, before)) in chunks.iter().enumerate() {
        let row0 = r.seq_of.len() as i32;
        new_seq(&mut r, (before + c) as i32, row0);
        for i in 0..c {
            r.seq_of.push(s as i32);
            r.pos.push((before + i) as i32);
            r.visible.push((before + i + 1) as i32);
        }
        let tile = kernels::PREFILL_TILE_ROWS as u32;
        for t0 in (0..c).step_by(tile as usize) {
            r.tiles.push([
                s as i32,
                row0 + t0 as i32,
                (c - t0).min(tile) as i32,
                (before + t0) as i32,
            ]);
        }
    }
    // Longest causal tiles first (they see the most keys), so none is left running alone.
    r.tiles
        .sort_by_key(|t| std::cmp::Reverse((t[3] + t[2], t[0], t[1])));
    r.first_decode_seq = chunks.len();
    for (k, &l) in decodes.iter().enumerate() {
        let s = chunks.len() + k;
        let row = r.seq_of.len() as i32;
        new_seq(&mut r, l as i32, row);
        r.seq_of.push(s as i32);
        r.pos.push(l as i32 - 1);
        r.visible.push(l as i32);
        let first = r.parts.len() as i32;
        let part = kernels::DECODE_PARTITION as u32;
        for k0 in (0..l).step_by(part as usize) {
            r.parts
                .push([s as i32, k0 as i32, (k0 + part).min(l) as i32]);
        }
        r.seq_parts.push([first, r.parts.len() as i32 - first]);
    }
    r.block_table = (0..blocks).collect();
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
        if shape.d != kernels::HEAD_DIM || !kernels::DECODE_GROUPS.contains(&(shape.nh / shape.nkv))
        {
            return Err(GpuError::Shape(format!(
                "the attention kernels take a head dimension of {} and {:?} query heads per KV head; {} has {} and {}",
                kernels::HEAD_DIM,
                kernels::DECODE_GROUPS,
                model.name,
                shape.d,
                shape.nh / shape.nkv
            )));
        }
        let cc = ctx.compute_capability().map_err(cuda)?;
        if cc.0 < 8 {
            return Err(GpuError::Shape(format!(
                "the attention kernels use bf16 tensor-core instructions (compute capability 8.0 or newer); this GPU is {}.{}",
                cc.0, cc.1
            )));
        }
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some("compute_80"),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernels::SOURCE, opts).map_err(cuda)?;
        let module = ctx.load_module(ptx).map_err(cuda)?;
        let mut funcs = HashMap::new();
        for name in kernels::ENTRY_POINTS {
            funcs.insert(*name, module.load_function(name).map_err(cuda)?);
        }
        let n = limits.max_tokens as usize;
        // Every sequence wastes less than one block; a measurement has at most n sequences.
        let cache_blocks = (limits.max_kv_tokens as usize).div_ceil(kernels::BLOCK_SIZE) + n;
        let kv = cache_blocks * kernels::BLOCK_SIZE * shape.nkv * shape.d;
        let max_parts = n + (limits.max_kv_tokens as usize).div_ceil(kernels::DECODE_PARTITION);
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
            partial: stream
                .alloc_zeros::<f32>(max_parts * shape.nh * (kernels::HEAD_DIM + 2))
                .map_err(cuda)?,
            stream,
            blas,
            funcs,
            shape,
            max_tokens: n,
            max_context: limits.max_context as usize,
            cache_blocks,
            max_parts,
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
            .arg(&meta.block_table)
            .arg(&meta.bt_start)
            .arg(&r)
            .arg(&nh)
            .arg(&nkv)
            .arg(&d);
        // SAFETY: every block-table entry is below the cache's block capacity and every
        // position below its sequence's blocks (checked in `time`); qkv holds rows x
        // (nh + 2 nkv) d values.
        unsafe { b.launch(cfg) }.map_err(cuda)?;
        if meta.tiles > 0 {
            let cfg = LaunchConfig {
                grid_dim: (meta.tiles as u32, s.nh as u32, 1),
                block_dim: (2 * kernels::PREFILL_TILE_ROWS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.funcs["prefill_attention"]);
            b.arg(&self.qkv)
                .arg(&self.k_cache)
                .arg(&self.v_cache)
                .arg(&meta.block_table)
                .arg(&meta.bt_start)
                .arg(&meta.tile_seq)
                .arg(&meta.tile_row)
                .arg(&meta.tile_rows)
                .arg(&meta.tile_pos)
                .arg(&mut self.attn)
                .arg(&nh)
                .arg(&nkv);
            // SAFETY: each tile's rows lie inside qkv and attn, its keys inside its
            // sequence's blocks; head dimension HEAD_DIM (checked in `new`).
            unsafe { b.launch(cfg) }.map_err(cuda)?;
        }
        if meta.parts > 0 {
            let cfg = LaunchConfig {
                grid_dim: (meta.parts as u32, s.nkv as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let entry = match s.nh / s.nkv {
                1 => "decode_attention_g1",
                2 => "decode_attention_g2",
                4 => "decode_attention_g4",
                _ => "decode_attention_g8",
            };
            let mut b = self.stream.launch_builder(&self.funcs[entry]);
            b.arg(&self.qkv)
                .arg(&self.k_cache)
                .arg(&self.v_cache)
                .arg(&meta.block_table)
                .arg(&meta.bt_start)
                .arg(&meta.seq_row)
                .arg(&meta.part_seq)
                .arg(&meta.part_start)
                .arg(&meta.part_end)
                .arg(&mut self.partial)
                .arg(&nh)
                .arg(&nkv);
            // SAFETY: the workspace holds `parts` x nh x (HEAD_DIM + 2) floats (checked in
            // `time`); keys lie inside each sequence's blocks.
            unsafe { b.launch(cfg) }.map_err(cuda)?;
            let first = meta.first_decode_seq as i32;
            let cfg = LaunchConfig {
                grid_dim: (meta.decodes as u32, s.nh as u32, 1),
                block_dim: (kernels::HEAD_DIM as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.funcs["decode_reduce"]);
            b.arg(&self.partial)
                .arg(&meta.seq_row)
                .arg(&meta.seq_part_first)
                .arg(&meta.seq_part_count)
                .arg(&first)
                .arg(&mut self.attn)
                .arg(&nh);
            // SAFETY: one block per decode sequence and head, partitions as written above.
            unsafe { b.launch(cfg) }.map_err(cuda)?;
        }
        Ok(())
    }

    fn upload(&self, rows: &AttentionRows, tokens: usize) -> Result<DeviceRows, GpuError> {
        // Linear-only measurements still need positions for RoPE.
        let pos: Vec<i32> = if rows.pos.is_empty() {
            (0..tokens as i32).collect()
        } else {
            rows.pos.clone()
        };
        let up = |v: Vec<i32>| {
            let v = if v.is_empty() { vec![0] } else { v };
            self.stream.clone_htod(&v).map_err(cuda)
        };
        let col4 = |k: usize| rows.tiles.iter().map(|t| t[k]).collect::<Vec<_>>();
        let col3 = |k: usize| rows.parts.iter().map(|t| t[k]).collect::<Vec<_>>();
        Ok(DeviceRows {
            seq_of: up(rows.seq_of.clone())?,
            pos: up(pos)?,
            seq_row: up(rows.seq_row.clone())?,
            bt_start: up(rows.bt_start.clone())?,
            block_table: up(rows.block_table.clone())?,
            tile_seq: up(col4(0))?,
            tile_row: up(col4(1))?,
            tile_rows: up(col4(2))?,
            tile_pos: up(col4(3))?,
            part_seq: up(col3(0))?,
            part_start: up(col3(1))?,
            part_end: up(col3(2))?,
            seq_part_first: up(rows.seq_parts.iter().map(|p| p[0]).collect())?,
            seq_part_count: up(rows.seq_parts.iter().map(|p| p[1]).collect())?,
            tiles: rows.tiles.len(),
            parts: rows.parts.len(),
            decodes: rows.seq_parts.len(),
            first_decode_seq: rows.first_decode_seq,
        })
    }

    /// Checks that `m` fits the buffers and builds its rows.
    fn rows_of(&self, m: &Measurement) -> Result<AttentionRows, GpuError> {
        let rows = m.tokens() as usize;
        if rows == 0 || rows > self.max_tokens {
            return Err(GpuError::Shape(format!(
                "{rows} tokens, outside 1..={}",
                self.max_tokens
            )));
        }
        let attn = attention_rows(m);
        self.check_rows(&attn)?;
        Ok(attn)
    }

    /// Checks that `attn`'s blocks, decode partitions and contexts fit the buffers.
    fn check_rows(&self, attn: &AttentionRows) -> Result<(), GpuError> {
        if attn.blocks() > self.cache_blocks
            || attn
                .block_table
                .iter()
                .any(|&b| b < 0 || b as usize >= self.cache_blocks)
            || attn.parts.len() > self.max_parts
            || attn.visible.iter().any(|&v| v as usize > self.max_context)
        {
            return Err(GpuError::Shape(format!(
                "the measurement needs {} KV blocks of {} (cache: {}), {} decode partitions (workspace: {}) or a context over {}",
                attn.blocks(),
                kernels::BLOCK_SIZE,
                self.cache_blocks,
                attn.parts.len(),
                self.max_parts,
                self.max_context
            )));
        }
        Ok(())
    }

    /// KV blocks of [`kernels::BLOCK_SIZE`] tokens the cache holds.
    pub fn cache_blocks(&self) -> usize {
        self.cache_blocks
    }

    /// One run of `layers` layers of the batch `m` with the attention rows `attn` the caller
    /// built (block tables included, e.g. from a [`crate::schedule::KvPager`]): the batch
    /// runs once, as a server runs it, appending its KV to the cache where later batches
    /// read it. With `ahead_cycles > 0` a kernel keeps the GPU waiting that many clock cycles
    /// first, so the host enqueues the layers before they start and the events time the
    /// GPU's work alone; with 0 the batch starts on an idle GPU as the host launches it.
    pub fn time_batch(
        &mut self,
        m: &Measurement,
        attn: &AttentionRows,
        layers: usize,
        ahead_cycles: i64,
    ) -> Result<BatchTiming, GpuError> {
        let rows = m.tokens() as usize;
        if rows == 0 || rows > self.max_tokens || attn.seq_of.len() > rows {
            return Err(GpuError::Shape(format!(
                "a batch of {rows} tokens ({} attention rows), outside 1..={}",
                attn.seq_of.len(),
                self.max_tokens
            )));
        }
        self.check_rows(attn)?;
        let meta = self.upload(attn, rows)?;
        let ctx = self.stream.context().clone();
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda)
        };
        let (start, end) = (event()?, event()?);
        if ahead_cycles > 0 {
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&self.funcs["spin_wait"]);
            b.arg(&ahead_cycles);
            // SAFETY: the kernel reads only its argument.
            unsafe { b.launch(cfg) }.map_err(cuda)?;
        }
        start.record(&self.stream).map_err(cuda)?;
        let issue = std::time::Instant::now();
        for _ in 0..layers.max(1) {
            self.run_once(m, &meta)?;
        }
        let issue_ms = issue.elapsed().as_secs_f64() * 1e3;
        end.record(&self.stream).map_err(cuda)?;
        Ok(BatchTiming {
            gpu_ms: f64::from(start.elapsed_ms(&end).map_err(cuda)?),
            issue_ms,
            ahead_ms: 0.0,
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
        let attn = self.rows_of(m)?;
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

/// The attention kernels against a CPU reference on one measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionCheck {
    /// The measurement, for people.
    pub case: String,
    /// Largest absolute difference between the kernels' output and the reference
    /// (inputs uniform in [-1, 1], so outputs are at most 1 in magnitude).
    pub max_abs_error: f64,
    /// Whether every row's K and V landed in its paged cache slot.
    pub kv_append_ok: bool,
}

impl AttentionCheck {
    /// Every K and V in its slot and every output within [`ATTENTION_CHECK_TOLERANCE`] of
    /// the reference (a NaN output fails).
    pub fn passed(&self) -> bool {
        self.kv_append_ok && self.max_abs_error <= ATTENTION_CHECK_TOLERANCE
    }
}

/// Largest error [`LayerRunner::check_attention`] accepts: bf16 rounding of the softmax
/// weights and of the output (2^-8 relative each) on outputs of magnitude <= 1.
pub const ATTENTION_CHECK_TOLERANCE: f64 = 2e-2;

/// The shapes [`LayerRunner::check_attention`] runs: causal chunks over cached context
/// (partial tiles, a one-token chunk), decodes over one and several partitions, and a mix.
pub fn attention_check_cases() -> Vec<Measurement> {
    vec![
        Measurement::PrefillAttention {
            chunks: vec![(130, 70), (64, 0), (1, 40)],
        },
        Measurement::DecodeAttention {
            contexts: vec![1, 17, 600, 1100],
        },
        Measurement::Composite {
            prefills: vec![(77, 300)],
            decodes: vec![5, 530],
        },
    ]
}

fn to_f64(v: bf16) -> f64 {
    f64::from(v.to_f32())
}

impl LayerRunner {
    /// Runs the attention kernels on [`attention_check_cases`] with random inputs and
    /// compares every output with a CPU reference (f64 softmax attention over the keys each
    /// row sees, read through the block table). Overwrites the activations and cache.
    pub fn check_attention(&mut self) -> Result<Vec<AttentionCheck>, GpuError> {
        let s = self.shape;
        let width = s.qkv_width();
        let group = s.nh / s.nkv;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut random = |len: usize| -> Vec<bf16> {
            (0..len)
                .map(|_| bf16::from_f32(rand::Rng::random_range(&mut rng, -1.0f32..1.0)))
                .collect()
        };
        let mut out = Vec::new();
        for m in attention_check_cases() {
            let rows = m.tokens() as usize;
            let attn = self.rows_of(&m)?;
            let cache_len = attn.blocks() * kernels::BLOCK_SIZE * s.nkv * s.d;
            let qkv_host = random(rows * width);
            let k_host = random(cache_len);
            let v_host = random(cache_len);
            self.stream
                .memcpy_htod(&qkv_host, &mut self.qkv.slice_mut(0..rows * width))
                .map_err(cuda)?;
            self.stream
                .memcpy_htod(&k_host, &mut self.k_cache.slice_mut(0..cache_len))
                .map_err(cuda)?;
            self.stream
                .memcpy_htod(&v_host, &mut self.v_cache.slice_mut(0..cache_len))
                .map_err(cuda)?;
            let meta = self.upload(&attn, rows)?;
            self.attention(rows, &meta)?;
            let got = self
                .stream
                .clone_dtoh(&self.attn.slice(0..rows * s.nh * s.d))
                .map_err(cuda)?;
            let kc = self
                .stream
                .clone_dtoh(&self.k_cache.slice(0..cache_len))
                .map_err(cuda)?;
            let vc = self
                .stream
                .clone_dtoh(&self.v_cache.slice(0..cache_len))
                .map_err(cuda)?;
            let slot = |seq: usize, pos: usize| {
                let b = attn.block_table[attn.bt_start[seq] as usize + pos / kernels::BLOCK_SIZE];
                b as usize * kernels::BLOCK_SIZE + pos % kernels::BLOCK_SIZE
            };
            let mut kv_append_ok = true;
            let mut max_err = 0.0f64;
            for r in 0..rows {
                let seq = attn.seq_of[r] as usize;
                let at = slot(seq, attn.pos[r] as usize) * s.nkv * s.d;
                let q_row = &qkv_host[r * width..(r + 1) * width];
                kv_append_ok &= kc[at..at + s.nkv * s.d] == q_row[s.nh * s.d..(s.nh + s.nkv) * s.d]
                    && vc[at..at + s.nkv * s.d] == q_row[(s.nh + s.nkv) * s.d..];
                let visible = attn.visible[r] as usize;
                for h in 0..s.nh {
                    let kvh = h / group;
                    let q = &q_row[h * s.d..(h + 1) * s.d];
                    let scores: Vec<f64> = (0..visible)
                        .map(|j| {
                            let k = slot(seq, j) * s.nkv * s.d + kvh * s.d;
                            q.iter()
                                .zip(&kc[k..k + s.d])
                                .map(|(&a, &b)| to_f64(a) * to_f64(b))
                                .sum::<f64>()
                                / (s.d as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                    let total: f64 = w.iter().sum();
                    for i in 0..s.d {
                        let reference: f64 = (0..visible)
                            .map(|j| w[j] * to_f64(vc[slot(seq, j) * s.nkv * s.d + kvh * s.d + i]))
                            .sum::<f64>()
                            / total;
                        let g = to_f64(got[r * s.nh * s.d + h * s.d + i]);
                        max_err = max_err.max((g - reference).abs());
                    }
                }
            }
            out.push(AttentionCheck {
                case: crate::samples::describe(&m),
                max_abs_error: if max_err.is_nan() {
                    f64::INFINITY
                } else {
                    max_err
                },
                kv_append_ok,
            });
        }
        Ok(out)
    }
}

/// Row metadata on the device (see [`AttentionRows`]).
struct DeviceRows {
    seq_of: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    seq_row: CudaSlice<i32>,
    bt_start: CudaSlice<i32>,
    block_table: CudaSlice<i32>,
    tile_seq: CudaSlice<i32>,
    tile_row: CudaSlice<i32>,
    tile_rows: CudaSlice<i32>,
    tile_pos: CudaSlice<i32>,
    part_seq: CudaSlice<i32>,
    part_start: CudaSlice<i32>,
    part_end: CudaSlice<i32>,
    seq_part_first: CudaSlice<i32>,
    seq_part_count: CudaSlice<i32>,
    tiles: usize,
    parts: usize,
    decodes: usize,
    first_decode_seq: usize,
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
        assert_eq!(r.seq_len, vec![5, 2, 4, 1]);
        assert_eq!(r.seq_row, vec![0, 3, 5, 6]);
        assert_eq!(r.seq_of.len() as u32, m.tokens());
        // One block of 16 slots per sequence here, a shuffle of 0..4.
        assert_eq!(r.bt_start, vec![0, 1, 2, 3]);
        let mut physical = r.block_table.clone();
        physical.sort_unstable();
        assert_eq!(physical, vec![0, 1, 2, 3]);
        // Prefill tiles: one per chunk; decode partitions: one per sequence.
        assert_eq!(r.tiles, vec![[0, 0, 3, 2], [1, 3, 2, 0]]);
        // (longest first: the first chunk's tile ends at position 5, the second's at 2)
        assert_eq!(r.first_decode_seq, 2);
        assert_eq!(r.parts, vec![[2, 0, 4], [3, 0, 1]]);
        assert_eq!(r.seq_parts, vec![[0, 1], [1, 1]]);
    }

    #[test]
    fn long_chunks_split_into_tiles_and_long_contexts_into_partitions() {
        let m = Measurement::Composite {
            prefills: vec![(130, 40)],
            decodes: vec![1100],
        };
        let r = attention_rows(&m);
        // 130 rows: tiles of 128 and 2, positions continuing after the 40 cached tokens,
        // the tile that sees the most keys first.
        assert_eq!(kernels::PREFILL_TILE_ROWS, 128);
        assert_eq!(r.tiles, vec![[0, 128, 2, 168], [0, 0, 128, 40]]);
        // 1,100 keys: four partitions of 256 and one of 76; the decode row follows the chunk.
        assert_eq!(
            r.parts,
            vec![
                [1, 0, 256],
                [1, 256, 512],
                [1, 512, 768],
                [1, 768, 1024],
                [1, 1024, 1100]
            ]
        );
        assert_eq!(r.seq_row, vec![0, 130]);
        // ceil(170 / 16) + ceil(1100 / 16) blocks, each used once.
        assert_eq!(r.blocks(), 11 + 69);
        assert_eq!(r.bt_start, vec![0, 11]);
        let mut physical = r.block_table.clone();
        physical.sort_unstable();
        assert_eq!(physical, (0..80).collect::<Vec<_>>());
        // Slots of different (sequence, position) pairs never collide.
        let mut slots: Vec<i64> = (0..2usize)
            .flat_map(|seq| {
                let r = &r;
                (0..r.seq_len[seq] as usize).map(move |p| {
                    i64::from(r.block_table[r.bt_start[seq] as usize + p / 16]) * 16
                        + (p % 16) as i64
                })
            })
            .collect();
        let n = slots.len();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), n);
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
