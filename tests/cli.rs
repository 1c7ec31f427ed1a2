//! End-to-end tests of the `infersched` binary, as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infersched"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).current_dir(root()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `solve` for mean latency with C = 2,048 on workload `w`, writing to `out`: what it
/// printed and its solve.json.
fn solve_mean_latency(
    w: &Path,
    out: &Path,
    time_limit: &str,
    extra: &[&str],
) -> (String, serde_json::Value) {
    let mut args = vec![
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--objective",
        "mean-latency",
        // The numbers these tests were measured with.
        "--cost-model",
        "llama2-7b-a100",
        "--token-budget",
        "2048",
        "--time-limit",
        time_limit,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let report =
        serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap()).unwrap();
    (stdout(&o), report)
}

/// The first `n` requests of the bundled Splitwise code trace, written to `dir/w.csv`.
fn first_splitwise_requests(n: usize, dir: &Path) -> std::path::PathBuf {
    let trace =
        std::fs::read_to_string(root().join("notebooks-data/traces/splitwise_code.csv")).unwrap();
    let w = dir.join("w.csv");
    std::fs::write(
        &w,
        trace.lines().take(n + 1).collect::<Vec<_>>().join("\n") + "\n",
    )
    .unwrap();
    w
}

fn example(name: &str) -> String {
    root()
        .join("notebooks-data/examples")
        .join(name)
        .display()
        .to_string()
}

fn replay_example(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "replay".to_string(),
        "--workload".into(),
        example("tiny-workload.csv"),
        "--schedule".into(),
        example("tiny-schedule.json"),
        "--token-budget".into(),
        "128".into(),
        "--kv-capacity".into(),
        "196".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    // The hand computations are of this preset's batch times, unless a test names another.
    if !extra.contains(&"--cost-model") {
        args.extend(["--cost-model".into(), "llama2-7b-a100".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&refs)
}

/// Per-batch time of the llama2-7b-a100 preset, written out from cost-model-presets.md.
fn preset_ms(
    tokens: f64,
    decode_kv: f64,
    n_decode: f64,
    attn: f64,
    ctx: f64,
    n_prefill: f64,
) -> f64 {
    let has_d = if n_decode > 0.0 { 1.0 } else { 0.0 };
    let has_p = if n_prefill > 0.0 { 1.0 } else { 0.0 };
    32.0 * (0.06486
        + 0.00191 * tokens
        + 0.01921 * has_d
        + 8.513e-6 * decode_kv
        + 0.00074 * n_decode
        + 0.0926 * has_p
        + 1.6773e-7 * attn
        + 0.001534 * n_prefill
        + 9.224e-6 * ctx)
}

#[test]
fn replay_of_the_bundled_example_matches_hand_computation() {
    let dir = tempfile::tempdir().unwrap();
    let o = replay_example(dir.path(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("is valid"), "{stdout}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    for key in [
        "makespan_s",
        "mean_e2e_s",
        "mean_ttft_s",
        "p99_tbt_s",
        "throughput_tok_s",
        "evictions",
        "batches",
    ] {
        assert!(s.get(key).is_some(), "summary.json lacks {key}");
    }
    // The five batches by hand (see tiny-schedule.json's notes):
    let b = [
        preset_ms(128.0, 0.0, 0.0, 96.0 * 96.0 + 32.0 * 32.0, 0.0, 2.0),
        preset_ms(
            65.0,
            97.0,
            1.0,
            (32.0f64 * 32.0 + 2.0 * 32.0 * 32.0) + 32.0 * 32.0,
            32.0,
            2.0,
        ),
        preset_ms(3.0, 98.0 + 65.0 + 33.0, 3.0, 0.0, 0.0, 0.0),
        preset_ms(2.0, 99.0 + 66.0, 2.0, 0.0, 0.0, 0.0),
        preset_ms(34.0, 0.0, 0.0, 34.0 * 34.0, 0.0, 1.0),
    ];
    let makespan: f64 = b.iter().sum::<f64>() / 1e3;
    let got = s["makespan_s"].as_f64().unwrap();
    assert!((got - makespan).abs() < 1e-12, "{got} vs {makespan}");
    assert_eq!(s["batches"], 5);
    assert_eq!(s["evictions"], 1);
    assert_eq!(s["recomputed_tokens"], 33);
    assert_eq!(s["peak_kv_tokens"], 196);
    // r2 arrives at 10 ms and gets its first token at the end of batch 1.
    let ttft2 = (b[0] + b[1]) / 1e3 - 0.01;
    let reqs = std::fs::read_to_string(dir.path().join("requests.csv")).unwrap();
    let row2: Vec<&str> = reqs.lines().nth(3).unwrap().split(',').collect();
    assert!((row2[8].parse::<f64>().unwrap() - ttft2).abs() < 1e-12);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("batches.csv"))
            .unwrap()
            .lines()
            .count(),
        6
    );
}

#[test]
fn replay_output_is_byte_identical_across_runs() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    assert!(replay_example(a.path(), &[]).status.success());
    assert!(replay_example(b.path(), &[]).status.success());
    for f in ["requests.csv", "batches.csv", "summary.json"] {
        assert_eq!(
            std::fs::read(a.path().join(f)).unwrap(),
            std::fs::read(b.path().join(f)).unwrap(),
            "{f}"
        );
    }
}

/// Runs a failing command and checks: non-zero exit, no panic, the message, no output.
fn assert_fails(args: &[&str], out: &Path, expect: &[&str]) {
    let o = run(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "should fail: {args:?}");
    assert!(!err.contains("panicked"), "{err}");
    for e in expect {
        assert!(err.contains(e), "expected {e:?} in: {err}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(out)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "partial output left: {leftovers:?}");
}

#[test]
fn bad_input_gets_a_clear_error_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let outs = out.display().to_string();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let bad_csv = write(
        "bad.csv",
        "num_prefill_tokens,num_decode_tokens\n12,3\n7,zero\n",
    );
    let zero_csv = write("zero.csv", "num_prefill_tokens,num_decode_tokens\n0,3\n");
    let big_csv = write("big.csv", "num_prefill_tokens,num_decode_tokens\n150,100\n");
    let bad_json = write(
        "bad.json",
        "{\"format\": \"infersched-schedule/1\",\n \"batches\": [\n {\"entries\": [{\"request\": 0 \"tokens\": 1}]}]}",
    );
    let tiny_w = example("tiny-workload.csv");
    let tiny_s = example("tiny-schedule.json");
    let replay = |w: &str, s: &str, extra: &[&str]| {
        let mut v = vec!["replay", "--workload", w, "--schedule", s, "--out", &outs];
        v.extend_from_slice(extra);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let check = |args: Vec<String>, expect: &[&str]| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_fails(&refs, &out, expect);
    };
    check(
        replay(&bad_csv, &tiny_s, &[]),
        &["bad.csv: line 3, column num_decode_tokens", "got \"zero\""],
    );
    check(
        replay(&zero_csv, &tiny_s, &[]),
        &[
            "zero.csv: line 2, column num_prefill_tokens",
            "from 1 to 4294967295",
        ],
    );
    check(
        replay(&tiny_w, &bad_json, &[]),
        &["bad.json: line 3 column"],
    );
    check(
        replay(&big_csv, &tiny_s, &["--kv-capacity", "200"]),
        &["infeasible", "request 0 needs 249 KV tokens", "M is 200"],
    );
    check(
        replay(&tiny_w, &tiny_s, &["--cost-model", "gpt-9"]),
        &["unknown cost model \"gpt-9\"", "llama2-7b-a100"],
    );
    check(
        replay(
            &tiny_w,
            &tiny_s,
            &["--token-budget", "64", "--prefill-budget", "100"],
        ),
        &["prefill-budget", "P = 100 exceeds the token budget C = 64"],
    );
    check(
        replay(&tiny_w, &tiny_s, &["--max-running", "0"]),
        &["max-running: must be >= 1"],
    );
    // A valid file whose schedule breaks a rule: C = 100 < 128 tokens in batch 0.
    check(
        replay(&tiny_w, &tiny_s, &["--token-budget", "100"]),
        &[
            "not a valid schedule",
            "batch 0: processes 128 tokens, over the token budget C = 100",
        ],
    );
    check(
        vec![
            "workload".into(),
            "describe".into(),
            dir.path().join("missing.csv").display().to_string(),
        ],
        &["missing.csv"],
    );
    check(
        vec![
            "workload".into(),
            "generate".into(),
            "--requests".into(),
            "3".into(),
            "--input".into(),
            "uniform:5:1".into(),
            "--output".into(),
            "fixed:1".into(),
            "--out".into(),
            out.join("w.csv").display().to_string(),
        ],
        &["--input", "invalid length distribution \"uniform:5:1\""],
    );
}

#[test]
fn workload_commands_generate_sample_and_describe() {
    let dir = tempfile::tempdir().unwrap();
    let gen_to = |name: &str| {
        let p = dir.path().join(name);
        let o = run(&[
            "workload",
            "generate",
            "--requests",
            "50",
            "--input",
            "zipf:1.1:16:512",
            "--output",
            "uniform:1:64",
            "--arrival",
            "gamma:4:2",
            "--seed",
            "3",
            "--out",
            p.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read(p).unwrap()
    };
    assert_eq!(gen_to("a.csv"), gen_to("b.csv"), "same seed, same bytes");
    let sampled = dir.path().join("s.csv");
    let o = run(&[
        "workload",
        "sample",
        "--trace",
        "notebooks-data/traces/arxiv_summarization.csv",
        "--random",
        "20",
        "--seed",
        "1",
        "--prefill-scale",
        "0.05",
        "--decode-scale",
        "0.1",
        "--max-total-tokens",
        "128",
        "--arrival",
        "poisson:2",
        "--out",
        sampled.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["workload", "describe", sampled.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["requests"], 20);
    assert!(s["min_kv_capacity"].as_u64().unwrap() <= 127);
    assert!(s["mean_qps"].as_f64().unwrap() > 0.0);
    let o = run(&[
        "workload",
        "describe",
        "notebooks-data/traces/splitwise_code.csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("requests            8819"));
}

/// Three prompts with one prefix admitted in one step: by vLLM v0's cache rule they share
/// its blocks (less memory than the solver's model counts) though none takes them from the
/// cache, so `compare` gives the row no ratio to the solver's optimum and bound and marks
/// it as using the cache.
#[test]
fn compare_gives_no_ratio_to_a_schedule_sharing_blocks_by_vllm_v0s_rule() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    std::fs::write(
        &w,
        "arrived_at,num_prefill_tokens,num_decode_tokens,hash_block_tokens,hash_ids\n\
         0,32,2,16,1 2\n0,32,2,16,1 2\n0,32,3,16,1 2\n",
    )
    .unwrap();
    let out = dir.path().join("cmp");
    let o = run(&[
        "compare",
        "--workload",
        w.to_str().unwrap(),
        "--schedulers",
        "vllm,optimal",
        "--enable-prefix-caching",
        "--cost-model",
        "llama2-7b-a100",
        "--kv-capacity",
        "256",
        "--block-size",
        "16",
        "--time-limit",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
            .unwrap();
    let row = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scheduler"] == "vllm")
        .unwrap();
    assert_eq!(row["cached_tokens"], 0);
    assert_eq!(row["shares_kv_blocks"], true);
    // 2 shared prompt blocks and one decode block each: 5 blocks, not 9.
    assert_eq!(row["peak_kv_tokens"], 80);
    assert!(row["ratio_to_optimum"].is_null() && row["ratio_to_bound"].is_null());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("vllm^"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn prefix_caching_asked_of_schedulers_without_one_is_refused_or_noted() {
    let dir = tempfile::tempdir().unwrap();
    let sampled = dir.path().join("m.csv");
    let trace = "notebooks-data/traces/mooncake/conversation_trace.jsonl";
    let o = run(&[
        "workload",
        "sample",
        "--trace",
        trace,
        "--first",
        "20",
        "--max-total-tokens",
        "8192",
        "--out",
        sampled.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("out");
    let simulate = |schedulers: &str| {
        run(&[
            "simulate",
            "--workload",
            sampled.to_str().unwrap(),
            "--scheduler",
            schedulers,
            "--cost-model",
            "llama3-8b-h100-fa2",
            "--enable-prefix-caching",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    // Neither Sarathi nor Orca models a cache: refused, nothing written.
    let o = simulate("sarathi,orca");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("only vllm-v1 and vllm (vLLM v0) model prefix caching"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("sarathi, orca would run without a cache"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
    // Beside vllm-v1 and vllm: a note naming the scheduler that runs without it.
    let o = simulate("vllm-v1,vllm,sarathi");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("sarathi run without a cache"),
        "{}",
        stderr(&o)
    );
    // vLLM v0's schedule names its cache rule, and its prompts took blocks from the cache.
    let v0 = std::fs::read_to_string(out.join("vllm").join("schedule.json")).unwrap();
    assert!(v0.contains("\"prefix_cache\":\"vllm-v0\""), "{v0}");
    assert!(v0.contains("\"cached\":"), "{v0}");
    let o = simulate("vllm-v1");
    assert!(o.status.success() && !stderr(&o).contains("note: --enable-prefix-caching"));
}

#[test]
fn mooncake_traces_carry_their_prefix_ids_through_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let trace = "notebooks-data/traces/mooncake/conversation_trace.jsonl";
    let o = run(&["workload", "describe", trace, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["requests"], 12031);
    // Checked by an independent script (a trie of the id chains, full blocks only).
    assert_eq!(s["prefix_cache"]["saved_tokens"], 54_063_104);
    assert_eq!(s["prefix_cache"]["requests_hit"], 12030);
    // A sample keeps the ids of the requests it keeps, cut with their prompts, in CSV.
    let sampled = dir.path().join("m.csv");
    let o = run(&[
        "workload",
        "sample",
        "--trace",
        trace,
        "--first",
        "200",
        "--max-total-tokens",
        "8192",
        "--out",
        sampled.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&sampled).unwrap();
    assert!(text.starts_with(
        "arrived_at,num_prefill_tokens,num_decode_tokens,hash_block_tokens,hash_ids\n0,6758,500,512,0 1 2 3 4 5 6 7 8 9 10 11 12 13\n"
    ));
    let o = run(&["workload", "describe", sampled.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("serves 139776 prompt tokens (12.3%); 199 requests reuse a block"),
        "{}",
        stdout(&o)
    );
    // Every policy serves it (the ids change no schedule yet).
    let o = run(&[
        "simulate",
        "--workload",
        sampled.to_str().unwrap(),
        "--scheduler",
        "vllm-v1,fastgen",
        "--cost-model",
        "llama3-8b-h100-fa2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A malformed line is named.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\nnot json\n").unwrap();
    let o = run(&["workload", "describe", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("bad.jsonl: line 2: expected {\"timestamp\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_hugging_face_config_gives_the_roofline_of_its_shape() {
    // The shipped config.json of a built-in model gives exactly its roofline.
    let show = |spec: &str| {
        let o = run(&["cost-model", "show", spec]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert_eq!(
        show("roofline:h100:notebooks-data/models/llama3-8b/config.json:tp2"),
        show("roofline:h100:llama3-8b:tp2")
    );
    // Any dense model: a shape of its own, its KV capacity from its KV heads, and every
    // command takes it.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-gqa");
    std::fs::create_dir(&model).unwrap();
    let config = model.join("config.json");
    std::fs::write(
        &config,
        r#"{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
            "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
            "torch_dtype": "bfloat16", "model_type": "llama"}"#,
    )
    .unwrap();
    let spec = format!("roofline:a100:{}", config.display());
    let text = show(&spec);
    assert!(text.starts_with("roofline:a100-80gb:tiny-gqa:"), "{text}");
    // 2 x 16 layers x 4 KV heads x 128 dims x 2 bytes = 32,768 bytes per token.
    assert!(text.contains("32768 KV bytes/token/GPU"), "{text}");
    let o = run(&[
        "simulate",
        "--workload",
        &example("arxiv-4.csv"),
        "--scheduler",
        "vllm-v1",
        "--cost-model",
        &spec,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A mixture of experts is refused, naming why.
    std::fs::write(
        &config,
        r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8}"#,
    )
    .unwrap();
    let o = run(&["cost-model", "show", &spec]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mixture-of-experts"), "{}", stderr(&o));
}

#[test]
fn the_default_cost_model_is_calibrated_and_unphysical_ones_are_warned_about_once() {
    let dir = tempfile::tempdir().unwrap();
    let sim = |extra: &[&str], out: &str| {
        let out = dir.path().join(out);
        let mut args = vec![
            "simulate",
            "--workload",
            "notebooks-data/examples/arxiv-4.csv",
            "--scheduler",
            "vllm,sarathi",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        (o, out)
    };
    let (o, out) = sim(&[], "default");
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("vllm/summary.json")).unwrap())
            .unwrap();
    assert!(summary["makespan_s"].as_f64().unwrap() > 0.0);
    assert!(
        stdout(&o).contains("cost model llama3-8b-h100-fa2"),
        "{}",
        stdout(&o)
    );
    // InferMax's A100 preset, faster than physics on small decodes: said once per command
    // although two schedulers use it.
    let (o, _) = sim(&["--cost-model", "llama2-7b-a100"], "a100");
    assert_eq!(
        stderr(&o)
            .matches("warning: llama2-7b-a100 predicts less time than")
            .count(),
        1,
        "{}",
        stderr(&o)
    );
}

#[test]
fn fit_writes_a_usable_cost_model() {
    let dir = tempfile::tempdir().unwrap();
    let coeffs = dir.path().join("fit.json");
    let o = run(&[
        "fit",
        "--samples",
        "notebooks-data/profiling/a100/llama-2-7b/mlp.csv",
        "--vidur-mlp",
        "--tp",
        "1",
        "--layers",
        "32",
        "--name",
        "vidur-mlp-a100",
        "--out",
        coeffs.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("R^2"));
    let out = dir.path().join("r");
    let o = replay_example(&out, &["--cost-model", coeffs.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["cost-model", "show", "llama2-7b-a100"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("KV capacity M = "));
    assert!(!String::from_utf8_lossy(&o.stdout).contains("all-reduces"));
    // A tensor-parallel roofline shows its all-reduces over both links, the one it
    // includes marked.
    let o = run(&["cost-model", "show", "roofline:h100:llama3-70b:tp8:pcie"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("tensor parallel 8: two all-reduces per layer"),
        "{text}"
    );
    let pcie = text
        .lines()
        .find(|l| l.starts_with("    over pcie"))
        .unwrap();
    let nvlink = text
        .lines()
        .find(|l| l.starts_with("    over nvlink"))
        .unwrap();
    assert!(pcie.contains("(in this model's tokens term)"), "{pcie}");
    assert!(!nvlink.contains("in this model"), "{nvlink}");
    // And what `--pp` sends between stages: Llama-3-70B's 2 x 8,192 x 2 bytes per token.
    assert!(
        text.contains(
            "    sends over nvlink ( 450 GB/s per direction) 72.82 ns per token + 7.2 us each"
        ),
        "{text}"
    );
    // NCCL's latencies are shown too, and marked in the model only with :nccl.
    let latency = |spec: &str, link: &str| {
        let o = run(&["cost-model", "show", spec]);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with(&format!("    NCCL latency over {link}")))
            .unwrap()
            .to_string()
    };
    let l = latency("roofline:h100:llama3-70b:tp8:pcie:nccl", "pcie");
    assert!(
        l.contains("20.6 us per all-reduce") && l.contains("in this model's one term"),
        "{l}"
    );
    let l = latency("roofline:h100:llama3-70b:tp8:pcie", "pcie");
    assert!(!l.contains("in this model"), "{l}");
    let l = latency("roofline:h100:llama3-70b:tp8:nvlink:nccl", "nvlink");
    assert!(
        l.contains("15.0 us per all-reduce") && l.contains("in this model"),
        "{l}"
    );

    // mlp.csv with a Vidur-format attention.csv: one file with every feature's theta.
    let attention = dir.path().join("attention.csv");
    let mut text = String::from(
        "batch_size,prefill_chunk_size,kv_cache_size,is_prefill,num_tensor_parallel_workers,\
         time_stats.attn_prefill.median,time_stats.attn_decode.median\n",
    );
    for c in [32u64, 128, 512, 2048] {
        for m in [0u64, 1024] {
            let t = 0.015 + 2e-8 * (c * c + 2 * c * m) as f64 + 1e-6 * m as f64;
            text.push_str(&format!("1,{c},{m},True,1,{t},\n"));
        }
    }
    for b in [1u64, 16, 128] {
        for m in [256u64, 4096] {
            let t = 0.008 + 5e-5 * b as f64 + 3e-7 * (b * (m + 1)) as f64;
            text.push_str(&format!("{b},0,{m},False,1,,{t}\n"));
        }
    }
    std::fs::write(&attention, text).unwrap();
    let both = dir.path().join("both.json");
    let o = run(&[
        "fit",
        "--samples",
        "notebooks-data/profiling/a100/llama-2-7b/mlp.csv",
        "--vidur-mlp",
        "--vidur-attention",
        attention.to_str().unwrap(),
        "--layers",
        "32",
        "--out",
        both.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&both).unwrap()).unwrap();
    let theta = &file["theta"];
    assert!(theta["tokens"].as_f64().unwrap() > 0.0);
    assert!(
        (theta["decode_kv"].as_f64().unwrap() - 3e-7).abs() < 1e-12,
        "{theta}"
    );
    assert!(
        (theta["prefill_attn"].as_f64().unwrap() - 2e-8).abs() < 1e-13,
        "{theta}"
    );
    assert!(
        (theta["has_decode"].as_f64().unwrap() - 0.008).abs() < 1e-9,
        "{theta}"
    );
    let stats = &file["provenance"]["fit"];
    assert_eq!(stats.as_object().unwrap().len(), 2, "{stats}");
    let o = run(&["cost-model", "show", both.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A feature fitted from two inputs is refused, naming it.
    let generic = dir.path().join("generic.csv");
    std::fs::write(&generic, "decode_kv,measured_ms\n10,1\n20,2\n").unwrap();
    let o = run(&[
        "fit",
        "--samples",
        generic.to_str().unwrap(),
        "--vidur-attention",
        attention.to_str().unwrap(),
        "--out",
        dir.path().join("x.json").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("feature decode_kv is in more than one input"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("x.json").exists());
}

#[test]
fn simulate_runs_several_schedulers_into_their_own_directories() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim");
    let w = dir.path().join("w.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "40",
        "--input",
        "uniform:16:300",
        "--output",
        "uniform:1:40",
        "--arrival",
        "poisson:50",
        "--seed",
        "9",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sim = |out: &Path| {
        run(&[
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            "vllm,sarathi,orca",
            "--kv-capacity",
            "2000",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = sim(&out);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("scheduler") && stdout.contains("sarathi"),
        "{stdout}"
    );
    // Each scheduler's makespan split, and the table of all of them.
    assert_eq!(stdout.matches("makespan split").count(), 3, "{stdout}");
    let table = stdout
        .split("where the makespan goes\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no time-split table: {stdout}"));
    assert!(table.starts_with("scheduler  batch bias"), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("orca ")).count(),
        1,
        "{table}"
    );
    for name in ["vllm", "sarathi", "orca"] {
        for f in [
            "schedule.json",
            "requests.csv",
            "batches.csv",
            "summary.json",
        ] {
            assert!(out.join(name).join(f).is_file(), "{name}/{f}");
        }
        // The written schedule replays to the same summary.
        let replayed = dir.path().join(format!("replayed-{name}"));
        let limits: &[&str] = match name {
            "vllm" => &[
                "--token-budget",
                "2048",
                "--max-running",
                "256",
                "--block-size",
                "16",
            ],
            "sarathi" => &[
                "--token-budget",
                "512",
                "--max-running",
                "128",
                "--block-size",
                "16",
            ],
            _ => &["--max-running", "256"],
        };
        let mut args = vec![
            "replay",
            "--workload",
            w.to_str().unwrap(),
            "--kv-capacity",
            "2000",
            "--out",
            replayed.to_str().unwrap(),
        ];
        let schedule = out.join(name).join("schedule.json");
        args.extend_from_slice(&["--schedule", schedule.to_str().unwrap()]);
        args.extend_from_slice(limits);
        let o = run(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(
            std::fs::read(replayed.join("summary.json")).unwrap(),
            std::fs::read(out.join(name).join("summary.json")).unwrap(),
            "{name}"
        );
    }
    // Byte-identical on a second run.
    let out2 = dir.path().join("sim2");
    assert!(sim(&out2).status.success());
    for name in ["vllm", "sarathi", "orca"] {
        for f in [
            "schedule.json",
            "requests.csv",
            "batches.csv",
            "summary.json",
        ] {
            assert_eq!(
                std::fs::read(out.join(name).join(f)).unwrap(),
                std::fs::read(out2.join(name).join(f)).unwrap(),
                "{name}/{f}"
            );
        }
    }
    // Bad scheduler names and requests that can never fit are clear errors.
    let bad = dir.path().join("bad");
    let o = run(&[
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm,fifo",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    // The flag's parser names the bad value and lists the good ones.
    assert!(
        stderr(&o).contains("invalid value 'fifo' for '--scheduler")
            && stderr(&o).contains("possible values: vllm, vllm-v1, sarathi"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "orca",
        "--kv-capacity",
        "100",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("KV tokens") && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );
    assert!(!bad.exists(), "no output for a failed run");
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    // `infersched ... | head -1`: the reader goes away and writes fail with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bin()
        .args(["cost-model", "show", "llama2-7b-a100"])
        .current_dir(root())
        .stdout(writer)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.status.success(), "{err}");
}

#[test]
fn solve_writes_an_optimal_schedule_and_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    std::fs::write(&w, "num_prefill_tokens,num_decode_tokens\n3,2\n2,3\n3,1\n").unwrap();
    let out = dir.path().join("solve");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--kv-capacity",
        "6",
        "--token-budget",
        "5",
        "--mip-gap",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("status                optimal") && stdout.contains("proven sufficient"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap()).unwrap();
    assert_eq!(report["status"], "optimal");
    let (obj, bound) = (
        report["replayed_objective"].as_f64().unwrap(),
        report["best_bound"].as_f64().unwrap(),
    );
    assert!(bound <= obj && bound > 0.0);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["makespan_s"].as_f64().unwrap(), obj);
    // The written schedule replays to the same summary.
    let again = dir.path().join("replayed");
    let o = run(&[
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--schedule",
        out.join("schedule.json").to_str().unwrap(),
        "--kv-capacity",
        "6",
        "--token-budget",
        "5",
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(again.join("summary.json")).unwrap(),
        std::fs::read(out.join("summary.json")).unwrap()
    );
    // Infeasible: a request needs more KV than M.
    let bad = dir.path().join("bad");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--kv-capacity",
        "3",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("infeasible: request 0 needs 4 KV tokens"),
        "{}",
        stderr(&o)
    );
    assert!(!bad.exists());
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--objective",
        "fastest",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("invalid value 'fastest' for '--objective")
            && stderr(&o).contains("possible values: makespan, mean-latency, mean-ttft"),
        "{}",
        stderr(&o)
    );
    // The warm start comes from the named heuristics only (same optimum).
    let orca = dir.path().join("orca");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--kv-capacity",
        "6",
        "--token-budget",
        "5",
        "--mip-gap",
        "0",
        "--warm-start-from",
        "orca",
        "--out",
        orca.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(orca.join("solve.json")).unwrap()).unwrap();
    assert!(
        r["warm_start"]["heuristic"]
            .as_str()
            .unwrap()
            .starts_with("orca"),
        "{}",
        r["warm_start"]
    );
    assert!((r["replayed_objective"].as_f64().unwrap() - obj).abs() < 1e-12);
    // Without the priority-list search the warm start is orca's own schedule.
    let plain = dir.path().join("plain");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--kv-capacity",
        "6",
        "--token-budget",
        "5",
        "--warm-start-from",
        "orca",
        "--list-search-tries",
        "0",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plain.join("solve.json")).unwrap()).unwrap();
    let name = p["warm_start"]["heuristic"].as_str().unwrap();
    assert!(
        name.starts_with("orca") && !name.contains("priority-list"),
        "{name}"
    );
    assert!((p["replayed_objective"].as_f64().unwrap() - obj).abs() < 1e-12);
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--warm-start-from",
        "vllm,fastest",
        "--out",
        bad.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--warm-start-from"), "{}", stderr(&o));
}

#[test]
fn replay_on_gpu_without_a_gpu_says_so_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = replay_example(&out, &["--on-gpu", "no-such-model"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("neither a known model"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists(), "nothing written for a bad model");
    if infersched::kernels_calibration::check_libraries().is_err() {
        let o = replay_example(&out, &["--on-gpu", "llama2-7b"]);
        assert_eq!(o.status.code(), Some(1), "an error exit, not a panic");
        assert!(
            stderr(&o).contains("no CUDA driver found"),
            "{}",
            stderr(&o)
        );
        assert!(!out.exists(), "nothing written without a GPU");
    }
    let o = replay_example(&out, &["--tp", "2"]);
    assert_eq!(o.status.code(), Some(2), "--tp needs --on-gpu");
}

#[test]
fn calibrate_without_a_gpu_says_so_and_refits_recorded_samples() {
    use infersched::kernels_calibration::{PlanLimits, plan, samples};
    let dir = tempfile::tempdir().unwrap();
    if infersched::kernels_calibration::check_libraries().is_err() {
        let o = run(&[
            "calibrate",
            "--model",
            "llama2-7b",
            "--out",
            &dir.path().join("gpu").display().to_string(),
        ]);
        assert_eq!(o.status.code(), Some(1), "an error exit, not a panic");
        let err = stderr(&o);
        assert!(
            err.contains("no CUDA driver found") || err.contains("LD_LIBRARY_PATH"),
            "{err}"
        );
    }
    // A recorded run (synthetic here: a known per-layer model with 1% deterministic
    // ripple), refitted by the same code the GPU run ends with.
    let theta = [
        0.05, 0.0019, 8.5e-6, 1.7e-7, 9.2e-6, 0.0015, 0.00074, 0.09, 0.019,
    ];
    let recorded = dir.path().join("recorded");
    std::fs::create_dir_all(&recorded).unwrap();
    let (mut fit_rows, mut held_out) = (Vec::new(), Vec::new());
    for (i, m) in plan(&PlanLimits::default()).iter().enumerate() {
        let exact = samples::predict_ms(&theta, &samples::Sample::of(m, 0.0).features);
        let s = samples::Sample::of(m, exact * (1.0 + 0.01 * ((i % 7) as f64 - 3.0) / 3.0));
        if m.group() == infersched::kernels_calibration::Group::Composite {
            held_out.push(s);
        } else {
            fit_rows.push(s);
        }
    }
    for (name, rows) in [("samples.csv", &fit_rows), ("validation.csv", &held_out)] {
        let mut buf = Vec::new();
        samples::write_csv(rows, &mut buf).unwrap();
        std::fs::write(recorded.join(name), buf).unwrap();
    }
    let run_json = serde_json::json!({
        "model": infersched::cost_model::ModelSpec::llama2_7b(),
        "tensor_parallel": 1, "gpu_name": "NVIDIA H200", "gpu_memory_bytes": 150_109_880_320u64,
        "compute_capability": "9.0", "driver_cuda_version": 13000, "nvrtc_version": "13.0",
        "repeats": 10, "warmup": 3
    });
    std::fs::write(recorded.join("run.json"), run_json.to_string()).unwrap();
    let out = dir.path().join("refit");
    let o = run(&[
        "calibrate",
        "--from-samples",
        &recorded.display().to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("held-out composite batches (40)"),
        "{stdout}"
    );
    let m = infersched::cost_model::resolve(&out.join("coefficients.json").display().to_string())
        .unwrap();
    assert_eq!(m.name, "llama2-7b-h200");
    assert_eq!(m.file.provenance.method, "calibration");
    // Per-token coefficient recovered (whole model: 32 layers, seconds).
    assert!(
        (m.theta_s[1] / (32.0 * 0.0019e-3) - 1.0).abs() < 0.02,
        "{:?}",
        m.theta_s
    );
    for f in [
        "samples.csv",
        "validation.csv",
        "run.json",
        "validation.svg",
        "validation.png",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
}

#[test]
fn the_phase_relaxation_raises_the_mean_latency_bound_on_real_requests() {
    // The first 8 Splitwise requests: no exact model fits, and the phase relaxation's
    // bound (0.616 s when measured) is above the combinatorial bounds that
    // --no-phase-relaxation leaves (0.528 s, the pairwise argument with its backlog terms;
    // the machine's 0.43 s before them), both valid.
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(8, dir.path());
    let solve =
        |extra: &[&str], name: &str| solve_mean_latency(&w, &dir.path().join(name), "8", extra).1;
    let with = solve(&[], "with");
    let without = solve(&["--no-phase-relaxation"], "without");
    assert_eq!(
        with["bound_method"]["combinatorial"], "phase-relaxation",
        "{with}"
    );
    // The machine relaxation's bounds (shortest remaining first, or the mean busy times)
    // or the pairwise argument.
    assert!(
        ["machine-srpt", "machine-busy-time", "pairwise-interference"]
            .contains(&without["bound_method"]["combinatorial"].as_str().unwrap()),
        "{without}"
    );
    let bound = |r: &serde_json::Value| r["best_bound"].as_f64().unwrap();
    let obj = with["replayed_objective"].as_f64().unwrap();
    let obj_without = without["replayed_objective"].as_f64().unwrap();
    assert!(
        bound(&without) * 1.05 < bound(&with) && bound(&with) <= obj,
        "{with}\n{without}"
    );
    // The plan search runs either way and says so: from the relaxation's plan, or from the
    // list search's own plan, which without the relaxation gets the time left (709.7 ->
    // 640.8 ms when measured; 640.6 ms from the relaxation's plans), so the two end within
    // 1% of each other.
    assert!(obj <= obj_without * 1.01, "{with}\n{without}");
    let from = without["warm_start"]["heuristic"].as_str().unwrap();
    assert!(from.contains(" re-planned (plans tried: "), "{from}");
}

#[test]
fn the_phase_relaxation_bounds_and_plans_mean_ttft_on_real_requests() {
    // The first 8 Splitwise requests by mean TTFT: the phase relaxation of the first
    // tokens alone (outputs cut to one token) bounds it above the machine bound, and its
    // plan, searched and finished after the first tokens, beats first tokens first and
    // the list search (480.7 -> 409.0 ms against a 390.5 ms bound when measured).
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(8, dir.path());
    let solve = |extra: &[&str], name: &str| {
        let out = dir.path().join(name);
        let mut args = vec![
            "solve",
            "--workload",
            w.to_str().unwrap(),
            "--objective",
            "mean-ttft",
            "--cost-model",
            "llama2-7b-a100",
            "--token-budget",
            "4096",
            "--kv-capacity",
            "32768",
            "--time-limit",
            "8",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap())
                .unwrap();
        report
    };
    let with = solve(&[], "with");
    let without = solve(&["--no-phase-relaxation"], "without");
    assert_eq!(
        with["bound_method"]["combinatorial"], "phase-relaxation",
        "{with}"
    );
    // The machine relaxation's bounds: shortest remaining first, or the mean busy times.
    assert!(
        ["machine-srpt", "machine-busy-time"]
            .contains(&without["bound_method"]["combinatorial"].as_str().unwrap()),
        "{without}"
    );
    let bound = |r: &serde_json::Value| r["best_bound"].as_f64().unwrap();
    let obj = |r: &serde_json::Value| r["replayed_objective"].as_f64().unwrap();
    assert!(
        bound(&without) < bound(&with) && bound(&with) <= obj(&with),
        "{with}\n{without}"
    );
    let from = with["warm_start"]["heuristic"].as_str().unwrap();
    assert!(from.contains("plan of the first tokens"), "{from}");
    assert!(obj(&with) < 0.9 * obj(&without), "{with}\n{without}");
    assert!(with["certified_gap"].as_f64().unwrap() < 0.1, "{with}");
}

#[test]
fn solve_takes_bursts_one_at_a_time_for_mean_latency() {
    // Two bursts of Splitwise-like requests five seconds apart: each is solved on its own,
    // the bound is the groups' size-weighted mean; --no-independent-groups solves the
    // whole workload. Each run's bound is at most both runs' replayed schedules.
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    std::fs::write(
        &w,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n\
         0,374,14\n0.01,34,12\n0.02,201,24\n5,137,9\n5.01,1145,7\n5.02,34,23\n",
    )
    .unwrap();
    let solve = |extra: &[&str], name: &str| {
        let (printed, report) = solve_mean_latency(&w, &dir.path().join(name), "6", extra);
        assert_eq!(
            printed.contains("independent-groups"),
            extra.is_empty(),
            "{printed}"
        );
        report
    };
    let grouped = solve(&[], "grouped");
    let whole = solve(&["--no-independent-groups"], "whole");
    // The whole workload's arc-flow model is too large here: the better of the groups'
    // concatenation and the whole workload's list-searched schedule is returned with the
    // groups' bound (best-heuristic method), or with the whole workload's phase relaxation
    // where that, run after the groups, beats them (it does when the groups' relaxations
    // got little time, as under the load of the other tests); the note says the groups
    // were solved either way.
    assert!(
        ["independent-groups", "phase-relaxation"]
            .contains(&grouped["bound_method"]["combinatorial"].as_str().unwrap()),
        "{grouped}"
    );
    assert!(
        grouped["bound_method"]["combinatorial"] == "independent-groups"
            || grouped["note"]
                .as_str()
                .unwrap()
                .contains("first solved as independent groups"),
        "{grouped}"
    );
    assert!(
        grouped["replayed_objective"].as_f64().unwrap()
            <= whole["replayed_objective"].as_f64().unwrap(),
        "{grouped}\n{whole}"
    );
    assert_ne!(whole["method"], "independent-groups", "{whole}");
    let bound = |r: &serde_json::Value| r["best_bound"].as_f64().unwrap();
    let obj = |r: &serde_json::Value| r["replayed_objective"].as_f64().unwrap();
    for r in [&grouped, &whole] {
        assert!(bound(r) > 0.0 && bound(r) <= obj(&grouped).min(obj(&whole)) * (1.0 + 1e-9));
    }
    // Nothing proves this schedule optimal: a bound clamped to it would hide an invalid one.
    assert!(bound(&grouped) < 0.99 * obj(&grouped), "{grouped}");
}

#[test]
fn the_memory_limit_refuses_a_milp_before_it_is_built() {
    // Three requests with arrivals (no counting search): their MILP has 254 columns and
    // is solved at the default limit; at 0.0001 GiB (104 KiB, 29 arc variables at 3.6 kB
    // each) it is refused before it is built, and the answer says why.
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    std::fs::write(
        &w,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,6,3\n0.001,4,2\n0.002,5,3\n",
    )
    .unwrap();
    let solve = |memory: &str| {
        let out = dir.path().join(format!("solve-{memory}"));
        let o = run(&[
            "solve",
            "--workload",
            w.to_str().unwrap(),
            "--memory-limit",
            memory,
            "--time-limit",
            "10",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap())
                .unwrap();
        (String::from_utf8_lossy(&o.stdout).into_owned(), report)
    };
    let (_, fits) = solve("4");
    assert_eq!(fits["status"], "optimal", "{fits}");
    let (stdout, refused) = solve("0.0001");
    assert_eq!(refused["status"], "not-proven", "{refused}");
    assert!(
        stdout.contains("more than 29 arc variables")
            && stdout.contains("what the memory limit of 104 KiB holds"),
        "{stdout}"
    );
    assert!(refused["best_bound"].as_f64().unwrap() > 0.0, "{refused}");
}

#[test]
fn solve_on_real_request_lengths_returns_a_schedule_and_a_positive_bound() {
    // The first 10 Splitwise requests (prompts up to 7,433 tokens) under C = 2,048: the
    // exact model's state graphs would take tens of GiB, so the solver must say so and
    // return the best heuristic schedule with a combinatorial bound, not exhaust memory.
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(10, dir.path());
    let out = dir.path().join("solve");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--token-budget",
        "2048",
        "--memory-limit",
        "1",
        "--time-limit",
        "20",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("over the memory limit of 1024 MiB"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap()).unwrap();
    assert_eq!(report["method"], "best-heuristic");
    assert_eq!(report["status"], "not-proven");
    let (obj, bound, gap) = (
        report["replayed_objective"].as_f64().unwrap(),
        report["best_bound"].as_f64().unwrap(),
        report["certified_gap"].as_f64().unwrap(),
    );
    assert!(bound > 0.0 && bound <= obj, "{bound} {obj}");
    // Makespan of these requests is mostly work: the bound certifies within 5%.
    assert!(gap < 0.05, "{gap}");
    // A bad memory limit is a clear error.
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--memory-limit",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("--memory-limit"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn vllm_flag_names_give_the_same_schedules_as_ours() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = |case: &str| {
        root()
            .join("notebooks-data/fidelity/vllm-0.32")
            .join(case)
            .join("workload.csv")
            .display()
            .to_string()
    };
    let simulate = |name: &str, workload: &str, flags: &[&str]| -> String {
        let out = dir.path().join(name);
        let mut args = vec![
            "simulate",
            "--workload",
            workload,
            "--scheduler",
            "vllm-v1",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let o = run(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        std::fs::read_to_string(out.join("vllm-v1").join("schedule.json")).unwrap()
    };
    let small = fixture("hand-chunk-preempt");
    let ours = simulate(
        "ours",
        &small,
        &[
            "--token-budget",
            "64",
            "--max-running",
            "8",
            "--kv-capacity",
            "256",
        ],
    );
    // vLLM's pool of 17 blocks of 16 holds 16 usable blocks besides its null block.
    let theirs = simulate(
        "theirs",
        &small,
        &[
            "--max-num-batched-tokens",
            "64",
            "--max-num-seqs",
            "8",
            "--num-gpu-blocks",
            "17",
            "--block-size",
            "16",
        ],
    );
    assert!(ours == theirs);
    // M from the cost model's model and GPU: 0.9 is the default; a smaller fraction is a
    // smaller M.
    let big = fixture("arxiv200-c512-m8000");
    let limits = ["--token-budget", "512", "--max-running", "64"];
    let m8000 = simulate(
        "m8000",
        &big,
        &[&limits[..], &["--kv-capacity", "8000"]].concat(),
    );
    let blocks501 = simulate(
        "blocks501",
        &big,
        &[&limits[..], &["--num-gpu-blocks", "501"]].concat(),
    );
    assert!(m8000 == blocks501);
    // One block fewer is another schedule (the flag is not ignored).
    let blocks500 = simulate(
        "blocks500",
        &big,
        &[&limits[..], &["--num-gpu-blocks", "500"]].concat(),
    );
    assert!(m8000 != blocks500);
    let default = simulate("default", &big, &["--token-budget", "512"]);
    let explicit = simulate(
        "explicit",
        &big,
        &["--token-budget", "512", "--gpu-memory-utilization", "0.9"],
    );
    assert!(default == explicit);
    let tight = simulate(
        "tight",
        &big,
        &["--token-budget", "512", "--gpu-memory-utilization", "0.2"],
    );
    assert!(default != tight);
    // vLLM 0.32's whole-prompt admission check is on unless switched off.
    let limits = [
        "--token-budget",
        "512",
        "--kv-capacity",
        "8000",
        "--max-running",
        "64",
    ];
    let on = simulate("isl-default", &big, &limits);
    let on_explicit = simulate(
        "isl-on",
        &big,
        &[&limits[..], &["--scheduler-reserve-full-isl"]].concat(),
    );
    let off = simulate(
        "isl-off",
        &big,
        &[&limits[..], &["--no-scheduler-reserve-full-isl"]].concat(),
    );
    assert!(on == on_explicit);
    assert!(on != off);
    // vLLM's per-request cap on tokens per step: 0 is off, a cap changes the chunks.
    let zero = simulate(
        "lp0",
        &big,
        &[&limits[..], &["--long-prefill-token-threshold", "0"]].concat(),
    );
    let capped = simulate(
        "lp64",
        &big,
        &[&limits[..], &["--long-prefill-token-threshold", "64"]].concat(),
    );
    assert!(zero == on);
    assert!(capped != on);
    // Two names for M at once are refused.
    let o = run(&[
        "simulate",
        "--workload",
        &small,
        "--scheduler",
        "vllm-v1",
        "--kv-capacity",
        "256",
        "--num-gpu-blocks",
        "17",
        "--out",
        dir.path().join("both").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--num-gpu-blocks"), "{}", stderr(&o));
}

#[cfg(unix)]
#[test]
fn an_output_path_that_is_not_a_regular_file_is_refused_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    // A socket stands in for /dev/full or a FIFO (tests must not touch /dev).
    let sock = dir.path().join("out.csv");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "3",
        "--input",
        "fixed:4",
        "--output",
        "fixed:2",
        "--out",
        sock.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket()
    );
    // Through a symbolic link, the link's target is written and the link kept.
    let target = dir.path().join("w.csv");
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "3",
        "--input",
        "fixed:4",
        "--output",
        "fixed:2",
        "--out",
        link.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap().lines().count(), 4);
}

#[test]
fn thread_and_job_counts_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    for threads in ["0", "1000000"] {
        let o = run(&[
            "solve",
            "--workload",
            &example("tiny-workload.csv"),
            "--threads",
            threads,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("--threads: expected 1 to 256"),
            "{}",
            stderr(&o)
        );
    }
    let spec = root().join("notebooks-data/experiments/rmax.toml");
    for jobs in ["0", "100000"] {
        let o = run(&[
            "sweep",
            spec.to_str().unwrap(),
            "--jobs",
            jobs,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("--jobs: expected 1 to 1024"),
            "{}",
            stderr(&o)
        );
    }
    assert!(!out.exists(), "nothing written");
}

/// A small sweep spec in `dir` (12 heuristic runs).
fn small_sweep_spec(dir: &Path) -> std::path::PathBuf {
    let spec = dir.join("spec.toml");
    std::fs::write(
        &spec,
        "[workload]\nn = 3\nI = 4\nO = 2\n[grid]\nM = [8, 12]\nseed = [0, 1]\nschedulers = [\"vllm\", \"sarathi\", \"orca\"]\n",
    )
    .unwrap();
    spec
}

#[cfg(unix)]
#[test]
fn the_sweep_lock_never_follows_a_link_nor_truncates_a_file_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_sweep_spec(dir.path());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, "the user's data\n").unwrap();
    let lock = out.join(".infersched-sweep.lock");
    std::os::unix::fs::symlink(&precious, &lock).unwrap();
    let sweep = |out: &Path| {
        run(&[
            "sweep",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = sweep(&out);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "the user's data\n"
    );
    assert!(!out.join("results.csv").exists());
    // A regular file there that a sweep did not write is refused, not emptied.
    std::fs::remove_file(&lock).unwrap();
    std::fs::write(&lock, "notes: keep me\n").unwrap();
    let o = sweep(&out);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not written by infersched"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), "notes: keep me\n");
    // A results.csv that is a link is not written through either.
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&precious, out.join("results.csv")).unwrap();
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--resume",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "the user's data\n"
    );
    // Nor is a plot that is a link.
    std::fs::remove_file(out.join("results.csv")).unwrap();
    std::fs::create_dir(out.join("plots")).unwrap();
    let plot = out.join("plots").join("makespan_s-vs-M.svg");
    std::os::unix::fs::symlink(&precious, &plot).unwrap();
    let o = sweep(&out);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(!out.join("results.csv").exists(), "refused before running");
    std::fs::remove_file(&plot).unwrap();
    assert_eq!(
        std::fs::read_to_string(&precious).unwrap(),
        "the user's data\n"
    );
    // A stale lock of an earlier sweep (its process id) is taken over.
    std::fs::write(&lock, "4242").unwrap();
    let o = sweep(&out);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn resume_refuses_a_file_it_cannot_use_without_cutting_it_and_keeps_what_it_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_sweep_spec(dir.path());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let results = out.join("results.csv");
    let resume = || {
        run(&[
            "sweep",
            spec.to_str().unwrap(),
            "--resume",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    // Garbage with newlines and a partial last line, and a user's small CSV.
    let mut garbage: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
    garbage.extend_from_slice(b"\nmore\xff\xfe bytes\nno newline at the end");
    for bytes in [garbage, b"a,b\n1,2\n3,4".to_vec()] {
        std::fs::write(&results, &bytes).unwrap();
        let o = resume();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert_eq!(std::fs::read(&results).unwrap(), bytes, "left as it was");
        assert!(!out.join("results.csv.cut").exists());
    }
    // Our own file, cut short by a kill: the cut line is kept beside it.
    std::fs::remove_file(&results).unwrap();
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let complete = std::fs::read_to_string(&results).unwrap();
    let lines: Vec<&str> = complete.lines().collect();
    let partial = format!("{}\n{}", lines[..4].join("\n"), &lines[4][..15]);
    std::fs::write(&results, &partial).unwrap();
    let o = resume();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&results).unwrap(), complete);
    assert_eq!(
        std::fs::read_to_string(out.join("results.csv.cut")).unwrap(),
        format!("{}\n", &lines[4][..15])
    );
}

#[test]
fn messages_quote_at_most_a_bounded_part_of_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let w = example("tiny-workload.csv");
    // (One argument may hold at most 128 KiB on Linux.)
    let long_name = "x".repeat(100_000);
    let o = run(&["simulate", "--workload", &w, "--scheduler", &long_name]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.len() < 2_000, "{} characters", err.len());
    assert!(
        err.contains("more characters]") && err.contains("--scheduler"),
        "{err}"
    );
    // A spec whose one long line does not parse: the line is not echoed whole.
    let spec = dir.path().join("long.toml");
    let values: Vec<String> = (0..200_000).map(|i| i.to_string()).collect();
    std::fs::write(
        &spec,
        format!("[grid]\nM = [{}, oops]\n", values.join(", ")),
    )
    .unwrap();
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.len() < 4_000, "{} characters", err.len());
    assert!(err.contains("long.toml"), "{err}");
    // A rate so low that arrivals leave the valid range: an error naming the flag, with
    // the number in scientific notation (sample used to panic here).
    let out = dir.path().join("w.csv");
    let trace = root().join("notebooks-data/traces/splitwise_code.csv");
    for args in [
        vec![
            "workload",
            "sample",
            "--trace",
            trace.to_str().unwrap(),
            "--first",
            "10",
        ],
        vec![
            "workload",
            "generate",
            "--requests",
            "10",
            "--input",
            "fixed:4",
            "--output",
            "fixed:2",
        ],
    ] {
        let mut args = args;
        args.extend([
            "--arrival",
            "poisson:1e-300",
            "--out",
            out.to_str().unwrap(),
        ]);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("arrival") && err.contains("e30"), "{err}");
        assert!(err.len() < 400, "{err}");
        assert!(!out.exists());
    }
}

#[test]
fn a_sweep_over_time_scales_runs_one_window_of_a_trace_at_each_speed() {
    let dir = tempfile::tempdir().unwrap();
    let trace = root().join("notebooks-data/traces/splitwise_code.csv");
    let spec = dir.path().join("s.toml");
    let write = |extra: &str| {
        std::fs::write(
            &spec,
            format!(
                "cost_model = \"llama3-8b-h100-fa2\"\n[workload]\ntrace = \"{}\"\nn = 30\nskip = 100\n{extra}\n[limits]\nC = 4096\nM = 32768\n[grid]\ntime_scale = [1.0, 0.1]\nschedulers = [\"vllm-v1\"]\nobjectives = [\"mean-latency\"]\n",
                trace.display()
            ),
        )
        .unwrap();
    };
    write("");
    let out = dir.path().join("o");
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut rows = csv::Reader::from_reader(text.as_bytes());
    let header = rows.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (&rows[0][col("time_scale")], &rows[1][col("time_scale")]),
        ("1", "0.1")
    );
    assert!(
        rows[1][col("key")].contains(";time_scale=0.1;"),
        "{:?}",
        &rows[1]
    );
    // The same 30 consecutive requests (rows 100-129), their arrivals ten times as close:
    // the last arrives sooner, so the makespan is shorter, and they queue more, so the mean
    // latency is longer (equal rows would mean the scale was ignored).
    let value = |r: &csv::StringRecord, c: &str| r[col(c)].parse::<f64>().unwrap();
    let (slow, fast) = (&rows[0], &rows[1]);
    assert!(value(fast, "makespan_s") < value(slow, "makespan_s"));
    assert!(value(fast, "mean_e2e_s") > value(slow, "mean_e2e_s"));
    // Consecutive rows, not 30 drawn from the trace's hour.
    assert!(
        value(slow, "makespan_s") < 60.0,
        "{}",
        value(slow, "makespan_s")
    );
    // Arrivals a Poisson rate would replace cannot also be scaled.
    write("arrival = \"poisson:2\"");
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--out",
        dir.path().join("p").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("sweep one or the other"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_comparison_that_cannot_finish_writing_says_which_outputs_are_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    std::fs::create_dir(&out).unwrap();
    // Where the plots go there is a file: writing stops there, as a full disk would.
    std::fs::write(out.join("plots"), "in the way").unwrap();
    let o = run(&[
        "compare",
        "--workload",
        &example("tiny-workload.csv"),
        "--schedulers",
        "vllm,orca",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("complete, each file whole: comparison.csv, comparison.json")
            && err.contains("orca/ (4 files)")
            && err.contains("report.html is written last"),
        "{err}"
    );
    assert!(!out.join("report.html").exists());
}

/// Under an address-space limit (`ulimit -v`) the memory plan counts what the limit leaves,
/// so schedulers run fewer at a time or are refused with the numbers, never aborted by a
/// failed allocation.
#[cfg(target_os = "linux")]
#[test]
fn simulate_plans_within_the_address_space_limit() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "40000",
        "--input",
        "uniform:16:1024",
        "--output",
        "uniform:16:256",
        "--arrival",
        "poisson:50",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let bin = env!("CARGO_BIN_EXE_infersched");
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v 1000000 && exec {bin} simulate --workload {} --scheduler vllm,sarathi,orca,mcsf,static,vllm-v1",
            w.display()
        ))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{:?}: {err}",
        o.status
    );
    assert!(err.contains("GiB is available"), "{err}");
    assert!(!err.contains("memory allocation"), "{err}");
}

#[test]
fn calibrate_from_samples_checks_the_recorded_run_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = dir.path().join("recorded");
    std::fs::create_dir(&recorded).unwrap();
    let src = root().join("notebooks-data/calibration/h100/llama2-7b");
    for f in ["samples.csv", "validation.csv"] {
        std::fs::copy(src.join(f), recorded.join(f)).unwrap();
    }
    let run_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("run.json")).unwrap()).unwrap();
    for (field, broken) in [
        ("layers", 0),
        ("tensor_parallel", 0),
        ("tensor_parallel", 3),
    ] {
        let mut r = run_json.clone();
        if field == "layers" {
            r["model"]["layers"] = broken.into();
        } else {
            r["tensor_parallel"] = broken.into();
        }
        std::fs::write(recorded.join("run.json"), r.to_string()).unwrap();
        let out = dir.path().join("out");
        let o = run(&[
            "calibrate",
            "--from-samples",
            recorded.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{field} = {broken}");
        let err = stderr(&o);
        assert!(err.contains("run.json") && err.contains(field), "{err}");
        assert!(!out.exists(), "nothing written for {field} = {broken}");
    }
    // An output that is a link is not written through.
    #[cfg(unix)]
    {
        std::fs::write(recorded.join("run.json"), run_json.to_string()).unwrap();
        let out = dir.path().join("linked");
        std::fs::create_dir(&out).unwrap();
        let precious = dir.path().join("precious.json");
        std::fs::write(&precious, "{}").unwrap();
        std::os::unix::fs::symlink(&precious, out.join("coefficients.json")).unwrap();
        let o = run(&[
            "calibrate",
            "--from-samples",
            recorded.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "{}");
        assert!(!out.join("samples.csv").exists(), "nothing written");
    }
}

#[test]
fn messages_name_the_cause_once_and_refuse_a_short_max_model_len() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = run(&[
        "simulate",
        "--workload",
        "/nonexistent/w.csv",
        "--scheduler",
        "vllm",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    // The tiny example's longest request has I + O = 100 tokens.
    for len in ["0", "99"] {
        let o = run(&[
            "simulate",
            "--workload",
            &example("tiny-workload.csv"),
            "--scheduler",
            "orca-max",
            "--max-model-len",
            len,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("request 0 has I + O = 100 tokens"),
            "{}",
            stderr(&o)
        );
    }
    assert!(!out.exists());
}

#[cfg(unix)]
#[test]
fn an_interrupted_solve_writes_its_best_schedule_and_no_temporary_files() {
    interrupted_solve("-INT");
}

/// SIGTERM (Slurm, systemd, `timeout`) is treated as Ctrl-C.
#[cfg(unix)]
#[test]
fn a_terminated_solve_writes_its_best_schedule_as_an_interrupted_one_does() {
    interrupted_solve("-TERM");
}

#[cfg(unix)]
fn interrupted_solve(signal: &str) {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("a32.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "32",
        "--input",
        "fixed:16",
        "--output",
        "fixed:8",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let out = dir.path().join("solve");
    // Family (a) with a token budget: the MILP runs to its time limit. Asked for alone
    // (`--milp-only`): the pooled search before it proves this instance optimal within
    // seconds once the solver is built optimized, and the MILP would never start.
    let child = bin()
        .args([
            "solve",
            "--workload",
            w.to_str().unwrap(),
            "--token-budget",
            "64",
            "--kv-capacity",
            "92",
            "--time-limit",
            "120",
            "--milp-only",
            "--out",
            out.to_str().unwrap(),
        ])
        .current_dir(root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // HiGHS's log file appears once the warm start is held and the MILP starts.
    let log_prefix = format!("infersched-highs-{}-", child.id());
    let started = Instant::now();
    while !std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(&log_prefix))
    {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the MILP never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let killed = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted") && err.contains("not proven optimal"),
        "{err}"
    );
    // The written schedule is valid for the problem, and nothing temporary is left.
    let replayed = dir.path().join("replayed");
    let o = run(&[
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--schedule",
        out.join("schedule.json").to_str().unwrap(),
        "--token-budget",
        "64",
        "--kv-capacity",
        "92",
        "--out",
        replayed.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    assert!(names.contains(&"summary.json".to_string()), "{names:?}");
}

#[test]
fn simulate_estimates_memory_first_and_runs_schedulers_one_at_a_time_when_needed() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "2000",
        "--input",
        "uniform:16:512",
        "--output",
        "uniform:16:256",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let sim = |limit: &str, schedulers: &str, out: &str| {
        run(&[
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            schedulers,
            "--memory-limit",
            limit,
            "--out",
            dir.path().join(out).to_str().unwrap(),
        ])
    };
    // About 2,000 x 136 entries x 48 bytes = 13 MB per scheduler.
    let o = sim("0.001", "vllm", "tiny");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("simulating vllm on 2000 requests needs about"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("tiny").exists());
    // Room for one at a time, not three at once: still all three, and said so.
    let o = sim("0.02", "vllm,sarathi,orca", "seq");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("running 1 at a time"), "{}", stderr(&o));
    for s in ["vllm", "sarathi", "orca"] {
        assert!(
            dir.path()
                .join("seq")
                .join(s)
                .join("summary.json")
                .is_file()
        );
    }
}

#[test]
fn a_grid_over_100000_runs_needs_yes() {
    let dir = tempfile::tempdir().unwrap();
    let ms = (1..=400)
        .map(|v| (v * 10).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let seeds = (0..300)
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let spec = dir.path().join("big.toml");
    std::fs::write(
        &spec,
        format!(
            "name = \"big\"\n[workload]\nn = 2\nI = 4\nO = 2\n[grid]\nM = [{ms}]\nseed = [{seeds}]\nschedulers = [\"vllm\"]\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("o");
    let o = run(&[
        "sweep",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("the grid has 120000 runs; pass --yes"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

#[test]
fn num_gpu_blocks_means_the_same_m_in_replay_and_compare() {
    let dir = tempfile::tempdir().unwrap();
    let (workload, schedule) = (example("tiny-workload.csv"), example("tiny-schedule.json"));
    let replay_with = |name: &str, m: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec![
            "replay",
            "--workload",
            &workload,
            "--schedule",
            &schedule,
            "--max-num-batched-tokens",
            "128",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(m);
        let o = run(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        std::fs::read_to_string(out.join("summary.json")).unwrap()
    };
    // 197 blocks of 1 token, one of them vLLM's null block: M = 196.
    let ours = replay_with("ours", &["--kv-capacity", "196"]);
    let theirs = replay_with("theirs", &["--num-gpu-blocks", "197"]);
    assert!(ours == theirs);
    // One block fewer than the schedule needs (its peak is 196 tokens) is refused.
    let out = dir.path().join("short");
    let o = run(&[
        "replay",
        "--workload",
        &example("tiny-workload.csv"),
        "--schedule",
        &example("tiny-schedule.json"),
        "--token-budget",
        "128",
        "--num-gpu-blocks",
        "196",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success(), "{}", stderr(&o));
}

#[test]
fn compare_and_simulate_give_the_same_schedule_for_the_same_flags() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "40",
        "--input",
        "uniform:16:256",
        "--output",
        "uniform:4:64",
        "--arrival",
        "poisson:50",
        "--seed",
        "7",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let schedulers = "vllm,vllm-v1,sarathi,orca,mcsf";
    // Only M (each policy's own C, R_max, block and watermark), then every limit given.
    let flag_sets: [&[&str]; 2] = [
        &["--kv-capacity", "1200"],
        &[
            "--kv-capacity",
            "1200",
            "--token-budget",
            "320",
            "--max-running",
            "6",
            "--block-size",
            "4",
            "--watermark",
            "0.05",
            "--victim",
            "oldest",
        ],
    ];
    let mut evictions = 0;
    for (k, flags) in flag_sets.iter().enumerate() {
        let sim = dir.path().join(format!("sim{k}"));
        let cmp = dir.path().join(format!("cmp{k}"));
        let mut args = vec![
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            schedulers,
            "--out",
            sim.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let s = run(&args);
        assert!(s.status.success(), "{}", stderr(&s));
        let mut args = vec![
            "compare",
            "--workload",
            w.to_str().unwrap(),
            "--schedulers",
            schedulers,
            "--out",
            cmp.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let c = run(&args);
        assert!(c.status.success(), "{}", stderr(&c));
        let (s_out, c_out) = (
            String::from_utf8_lossy(&s.stdout).into_owned(),
            String::from_utf8_lossy(&c.stdout).into_owned(),
        );
        for name in schedulers.split(',') {
            let a = std::fs::read(sim.join(name).join("schedule.json")).unwrap();
            let b = std::fs::read(cmp.join(name).join("schedule.json")).unwrap();
            assert!(a == b, "flags {flags:?}: {name}'s schedules differ");
            // Both print the limits it ran under, the same way.
            let line = s_out
                .lines()
                .find(|l| l.starts_with(&format!("{name} (")))
                .unwrap_or_else(|| panic!("{s_out}"));
            let limits = &line[name.len() + 2..line.len() - 1];
            assert!(
                c_out.contains(&format!("  {name:<10} {limits}")),
                "{name}: {limits} not in\n{c_out}"
            );
            let summary: serde_json::Value = serde_json::from_slice(
                &std::fs::read(sim.join(name).join("summary.json")).unwrap(),
            )
            .unwrap();
            evictions += summary["evictions"].as_u64().unwrap();
        }
    }
    // The memory is tight enough that the policies' eviction rules matter.
    assert!(evictions > 0);
}

#[test]
fn compare_takes_the_solvers_policy_class_and_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let o = run(&[
        "compare",
        "--workload",
        &example("arxiv-4.csv"),
        "--schedulers",
        "optimal,orca",
        "--kv-capacity",
        "20",
        "--block-size",
        "1",
        "--no-evict",
        "--fcfs",
        "--horizon",
        "12",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("comparison.json")).unwrap()).unwrap();
    let solve = &c["solve"];
    assert_eq!(solve["constraints"]["no_evict"], true);
    assert_eq!(solve["constraints"]["fcfs"], true);
    assert_eq!(solve["constraints"]["reserve"], false);
    assert_eq!(solve["horizon"], 12);
    // The class costs something here: its optimum is above the unconstrained one.
    let free = dir.path().join("free");
    let o = run(&[
        "compare",
        "--workload",
        &example("arxiv-4.csv"),
        "--schedulers",
        "optimal",
        "--kv-capacity",
        "20",
        "--block-size",
        "1",
        "--out",
        free.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let f: serde_json::Value =
        serde_json::from_slice(&std::fs::read(free.join("comparison.json")).unwrap()).unwrap();
    let value = |v: &serde_json::Value| v["rows"][0]["objective_s"].as_f64().unwrap();
    assert!(
        value(&c) > value(&f) * 1.01,
        "{} vs {}",
        value(&c),
        value(&f)
    );
}

#[test]
fn simulate_without_out_prints_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .args([
            "simulate",
            "--workload",
            &example("arxiv-4.csv"),
            "--scheduler",
            "vllm,orca",
            "--kv-capacity",
            "64",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("makespan") && out.contains("orca ("), "{out}");
    assert!(!out.contains("wrote"), "{out}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn slos_give_attainment_and_goodput_in_simulate_and_replay_and_nothing_without() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    let with = dir.path().join("with");
    let workload = example("arxiv-4.csv");
    let sim = |out: &Path, slos: &[&str]| {
        let mut args = vec![
            "simulate",
            "--workload",
            &workload,
            "--scheduler",
            "vllm",
            "--kv-capacity",
            "64",
            "--out",
            out.to_str().unwrap(),
        ];
        for s in slos {
            args.extend(["--slo", s]);
        }
        run(&args)
    };
    assert!(sim(&plain, &[]).status.success());
    // One scheduler gets its own folder, as several do.
    let summary = |d: &Path| -> serde_json::Value {
        let path = d.join("vllm").join("summary.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let base = summary(&plain);
    assert!(base.get("slo").is_none(), "no SLO asked for, none written");
    // An E2E threshold between the smallest and the largest E2E: some requests meet it.
    let e2es: Vec<f64> = std::fs::read_to_string(plain.join("vllm").join("requests.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(10).unwrap().parse().unwrap())
        .collect();
    let (lo, hi) = e2es
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(lo < hi, "{e2es:?}");
    let threshold = format!("e2e-max={}ms", (lo + hi) / 2.0 * 1e3);
    let o = sim(&with, &[&threshold, "ttft-mean=1000s"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("SLO attainment"), "{}", stdout(&o));
    let slo = &summary(&with)["slo"];
    let met = e2es.iter().filter(|&&t| t <= (lo + hi) / 2.0).count();
    assert_eq!(slo["good_requests"].as_u64().unwrap() as usize, met);
    assert_eq!(
        slo["attainment"].as_f64().unwrap(),
        met as f64 / e2es.len() as f64
    );
    assert_eq!(slo["all_hold"], false);
    assert_eq!(slo["slos"][0]["holds"], false);
    assert_eq!(slo["slos"][1]["holds"], true);
    // Everything else in the summary is what it was without SLOs.
    let mut rest = summary(&with);
    rest.as_object_mut().unwrap().remove("slo");
    assert_eq!(rest, base);
    // replay reads the same SLOs of the same schedule the same way.
    let again = dir.path().join("again");
    let o = run(&[
        "replay",
        "--workload",
        &workload,
        "--schedule",
        with.join("vllm").join("schedule.json").to_str().unwrap(),
        "--kv-capacity",
        "64",
        "--slo",
        &threshold,
        "--slo",
        "ttft-mean=1000s",
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let replayed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(replayed["slo"], *slo);
    // A malformed SLO is refused before anything runs, naming it.
    let bad = dir.path().join("bad");
    let o = sim(&bad, &["ttft-p90=2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("SLO \"ttft-p90=2\": time \"2\" has no unit"),
        "{}",
        stderr(&o)
    );
    assert!(!bad.exists());
}

#[test]
fn capacity_finds_each_schedulers_rate_and_refuses_what_it_cannot_scale() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "40",
        "--input",
        "fixed:512",
        "--output",
        "fixed:32",
        "--arrival",
        "poisson:5",
        "--seed",
        "1",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("cap");
    let capacity = |workload: &Path, extra: &[&str]| {
        let mut args = vec![
            "capacity",
            "--workload",
            workload.to_str().unwrap(),
            "--scheduler",
            "vllm-v1,sarathi",
            "--cost-model",
            "llama3-8b-h100-fa2",
        ];
        args.extend(extra);
        run(&args)
    };
    let o = capacity(
        &w,
        &["--slo", "ttft-p90=300ms", "--out", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("capacity.csv")).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        stdout(&o).contains("requests/s (misses at"),
        "{}",
        stdout(&o)
    );
    for (row, name) in rows.iter().zip(["vllm-v1", "sarathi"]) {
        assert_eq!(row[0], "llama3-8b-h100-fa2");
        assert_eq!(row[1], name);
        assert_eq!(row[10], "found", "{text}");
        let (rate, above): (f64, f64) = (row[11].parse().unwrap(), row[12].parse().unwrap());
        assert!(
            rate > 0.0 && above > rate && above / rate <= 1.01 + 1e-9,
            "{text}"
        );
        assert_eq!(row[13], "ttft-p90=0.3s");
        assert!(row[16].parse::<usize>().unwrap() <= 64);
    }
    // A grid: every token budget with every scheduler, the budget in its column.
    let grid = dir.path().join("grid");
    let o = capacity(
        &w,
        &[
            "--slo",
            "ttft-p90=300ms",
            "--grid",
            "token-budget=256,4096",
            "--out",
            grid.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(grid.join("capacity.csv")).unwrap();
    let budgets: Vec<(String, String)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[1].to_string(), c[6].to_string())
        })
        .collect();
    let expected = [
        ("vllm-v1", "256"),
        ("sarathi", "256"),
        ("vllm-v1", "4096"),
        ("sarathi", "4096"),
    ]
    .map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(budgets, expected);
    let o = capacity(&w, &["--slo", "ttft-p90=1s", "--grid", "budget=1,2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown knob \"budget\""),
        "{}",
        stderr(&o)
    );
    // Without SLOs, or with arrivals all at once, it says why and writes nothing.
    let o = capacity(&w, &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("--slo"),
        "{}",
        stderr(&o)
    );
    let at_once = dir.path().join("static.csv");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "8",
        "--input",
        "fixed:64",
        "--output",
        "fixed:8",
        "--arrival",
        "static",
        "--out",
        at_once.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let none = dir.path().join("none");
    let o = capacity(
        &at_once,
        &["--slo", "ttft-p90=1s", "--out", none.to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("arrive at one instant"),
        "{}",
        stderr(&o)
    );
    assert!(!none.exists());
    // Poisson arrivals at each rate give it rates all the same.
    let o = capacity(
        &at_once,
        &[
            "--slo",
            "ttft-p90=10ms",
            "--arrivals",
            "poisson:5",
            "--out",
            none.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Poisson arrivals at each rate, seed 5"),
        "{}",
        stdout(&o)
    );
    let csv = std::fs::read_to_string(none.join("capacity.csv")).unwrap();
    assert!(csv.lines().nth(1).unwrap().contains(",found,"), "{csv}");
    let o = capacity(&at_once, &["--slo", "ttft-p90=1s", "--arrivals", "uniform"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("expected trace, poisson or poisson:SEED"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn capacity_shards_merge_into_the_whole_run() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(200, dir.path());
    let run_with = |extra: &[&str]| {
        let mut args = vec![
            "capacity",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            "vllm-v1,sarathi",
            "--slo",
            "ttft-p90=300ms",
            "--grid",
            "max-running=16,64",
        ];
        args.extend(extra);
        run(&args)
    };
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    for (shard, name) in [("1/3", "s1"), ("2/3", "s2"), ("3/3", "s3"), ("1/1", "all")] {
        let o = run_with(&["--shard", shard, "--out", &out(name)]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let rows = |name: &str| {
        std::fs::read_to_string(dir.path().join(name).join("capacity.csv"))
            .unwrap()
            .lines()
            .count()
            - 1
    };
    // Four configurations: every third from the shard's own.
    assert_eq!(
        (rows("s1"), rows("s2"), rows("s3"), rows("all")),
        (2, 1, 1, 4)
    );
    let o = run_with(&[
        "--merge",
        &out("s2"),
        &out("s3"),
        &out("s1"),
        "--out",
        &out("m"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("merged 4 configurations from 3 shards"),
        "{}",
        stdout(&o)
    );
    let read =
        |name: &str| std::fs::read_to_string(dir.path().join(name).join("capacity.csv")).unwrap();
    assert_eq!(read("m"), read("all"));
    assert!(dir.path().join("m/capacity.svg").is_file());
    // A shard missing, a shard twice, other arguments: each refused, saying which.
    let o = run_with(&["--merge", &out("s1"), &out("s2"), "--out", &out("x")]);
    assert!(
        stderr(&o).contains("1 of the 4 configurations are in no shard"),
        "{}",
        stderr(&o)
    );
    let o = run_with(&[
        "--merge",
        &out("s1"),
        &out("s1"),
        &out("s2"),
        &out("s3"),
        "--out",
        &out("x"),
    ]);
    assert!(stderr(&o).contains("is in "), "{}", stderr(&o));
    let o = run(&[
        "capacity",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "sarathi,vllm-v1",
        "--slo",
        "ttft-p90=300ms",
        "--grid",
        "max-running=16,64",
        "--merge",
        &out("all"),
    ]);
    assert!(
        stderr(&o).contains("were the shards run with other arguments?"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("x").exists());
}

#[test]
fn compare_can_skip_plots_and_traces() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let o = run(&[
        "compare",
        "--workload",
        &example("arxiv-4.csv"),
        "--schedulers",
        "vllm,orca",
        "--kv-capacity",
        "64",
        "--no-plots",
        "--no-traces",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("report.html").is_file() && out.join("comparison.csv").is_file());
    assert!(out.join("vllm").join("schedule.json").is_file());
    assert!(!out.join("plots").exists());
    assert!(!out.join("trace-vllm.json").exists());
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(!html.contains("<svg"), "the report has no figures");
    // By default both are written.
    let full = dir.path().join("full");
    let o = run(&[
        "compare",
        "--workload",
        &example("arxiv-4.csv"),
        "--schedulers",
        "vllm,orca",
        "--kv-capacity",
        "64",
        "--out",
        full.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(full.join("plots").is_dir() && full.join("trace-vllm.json").is_file());
}

#[test]
fn compare_on_replicas_runs_every_heuristic_behind_each_router() {
    let dir = tempfile::tempdir().unwrap();
    let wl = dir.path().join("w.csv");
    std::fs::write(
        &wl,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,300,20\n0,40,5\n0.01,200,30\n0.02,30,4\n0.03,250,10\n0.05,20,6\n",
    )
    .unwrap();
    let compare = |routers: &str, name: &str| {
        let out = dir.path().join(name);
        let o = run(&[
            "compare",
            "--workload",
            wl.to_str().unwrap(),
            "--schedulers",
            "vllm-v1,sarathi",
            "--kv-capacity",
            "2048",
            "--token-budget",
            "512",
            "--replicas",
            "2",
            "--router",
            routers,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
                .unwrap();
        (out, doc)
    };
    let (out, doc) = compare("round-robin,least-kv", "both");
    assert_eq!(doc["setting"]["cluster"]["router"], "round-robin,least-kv");
    let rows = doc["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["scheduler"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "vllm-v1@round-robin",
            "vllm-v1@least-kv",
            "sarathi@round-robin",
            "sarathi@least-kv"
        ]
    );
    // Each row is the single-router comparison's row, in a folder named like it.
    for router in ["round-robin", "least-kv"] {
        let (_, one) = compare(router, router);
        for (k, sched) in ["vllm-v1", "sarathi"].iter().enumerate() {
            let single = &one["rows"][k];
            let multi = rows
                .iter()
                .find(|r| r["scheduler"] == format!("{sched}@{router}"))
                .unwrap();
            assert_eq!(
                multi["objective_s"], single["objective_s"],
                "{sched}@{router}"
            );
            assert_eq!(multi["router"], router);
            assert!(single["router"].is_null());
            assert!(out.join(format!("{sched}@{router}/routing.csv")).is_file());
        }
    }
    // The latency CDFs have a series per (scheduler, router); the CSV names the router.
    let cdf = std::fs::read_to_string(out.join("plots/latency-cdf.svg")).unwrap();
    assert!(cdf.contains(">sarathi@least-kv<") && cdf.contains(">vllm-v1@round-robin<"));
    let csv = std::fs::read_to_string(out.join("comparison.csv")).unwrap();
    assert!(csv.lines().next().unwrap().ends_with(",router"));
    assert!(csv.lines().nth(2).unwrap().ends_with(",least-kv"), "{csv}");
    // Several routers need several replicas.
    let bad = dir.path().join("bad");
    assert_fails(
        &[
            "compare",
            "--workload",
            wl.to_str().unwrap(),
            "--schedulers",
            "vllm-v1",
            "--replicas",
            "1",
            "--router",
            "round-robin,least-kv",
            "--out",
            bad.to_str().unwrap(),
        ],
        &bad,
        &["--router lists 2 routers"],
    );
}

#[test]
fn compare_on_replicas_runs_every_scheduler_on_the_cluster_and_the_cluster_search() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let wl = dir.path().join("w.csv");
    std::fs::write(
        &wl,
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,300,20\n0,40,5\n0.01,200,30\n0.02,30,4\n0.03,250,10\n0.05,20,6\n",
    )
    .unwrap();
    let args = [
        "compare",
        "--workload",
        wl.to_str().unwrap(),
        "--schedulers",
        "optimal,vllm-v1,fastgen",
        "--objective",
        "mean-latency",
        "--kv-capacity",
        "2048",
        "--token-budget",
        "512",
        "--time-limit",
        "3",
        "--replicas",
        "2",
        "--router",
        "least-outstanding",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("2 replicas behind least-outstanding"),
        "{}",
        stdout(&o)
    );
    // Each scheduler's folder is a cluster's; the solver's has the search's report.
    for name in ["optimal", "vllm-v1", "fastgen"] {
        let routing = std::fs::read_to_string(out.join(name).join("routing.csv")).unwrap();
        assert_eq!(
            routing.lines().count(),
            1 + 6,
            "{name}: every request routed once"
        );
        assert!(
            out.join(name).join("replica-1/schedule.json").is_file(),
            "{name}"
        );
        assert!(
            out.join(name).join("replica-0/trace.json").is_file(),
            "{name}"
        );
    }
    let search: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("optimal/solve.json")).unwrap())
            .unwrap();
    assert_eq!(search["replicas"], 2);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
            .unwrap();
    assert_eq!(doc["setting"]["cluster"]["replicas"], 2);
    assert_eq!(doc["setting"]["cluster"]["router"], "least-outstanding");
    let rows = doc["rows"].as_array().unwrap();
    let solver = &rows[0];
    let (best, bound) = (
        solver["objective_s"].as_f64().unwrap(),
        solver["best_bound_s"].as_f64().unwrap(),
    );
    assert!(bound > 0.0 && bound <= best, "{solver}");
    // Called optimal only with a proof; its method is the cluster search's.
    let proven = search["status"] == "optimal";
    assert_eq!(
        solver["scheduler"],
        if proven { "optimal" } else { "best-found" }
    );
    assert!(
        solver["method"].as_str().unwrap().starts_with("cluster-"),
        "{solver}"
    );
    for row in &rows[1..] {
        // The search runs every heuristic behind every router, so none beats it.
        assert!(
            row["objective_s"].as_f64().unwrap() >= best * (1.0 - 1e-9),
            "{row}"
        );
    }
    // The plots call the solver's series by the row's label, and show each replica's load.
    let cdf = std::fs::read_to_string(out.join("plots/latency-cdf.svg")).unwrap();
    let label = if proven { ">optimal<" } else { ">best-found<" };
    assert!(
        cdf.contains(label),
        "the legend names the solver's row {label}"
    );
    assert!(proven || !cdf.contains(">optimal<"));
    assert!(out.join("plots/replica-load.svg").is_file());
    assert!(
        !out.join("plots/kv-memory.svg").exists(),
        "KV is per replica"
    );
    // ... in a plot per contender, a series per replica.
    let kv = std::fs::read_to_string(out.join("plots/kv-memory-vllm-v1.svg")).unwrap();
    assert!(kv.contains(">replica 0<") && kv.contains(">replica 1<"));
    assert!(!kv.contains(">replica 2<"));
    // ... and a timeline of each contender's replicas, a row each.
    let tl = std::fs::read_to_string(out.join("plots/timeline-fastgen.svg")).unwrap();
    assert!(tl.contains("fastgen: batches on each replica"), "{tl}");
    assert!(
        tl.contains(">replica<") && tl.contains(">decodes only<"),
        "{tl}"
    );
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("timeline-fastgen"));
    // The cluster's metrics are the merged replay's: one row per request.
    let requests = std::fs::read_to_string(out.join("vllm-v1/requests.csv")).unwrap();
    assert_eq!(requests.lines().count(), 1 + 6);
    // Without --replicas the same flags give today's single-replica folders.
    let single = dir.path().join("one");
    let o = run(&[
        "compare",
        "--workload",
        wl.to_str().unwrap(),
        "--schedulers",
        "vllm-v1",
        "--kv-capacity",
        "2048",
        "--token-budget",
        "512",
        "--out",
        single.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(single.join("vllm-v1/schedule.json").is_file());
}

#[test]
fn simulate_traces_every_request_from_arrival_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let out = dir.path().join("sim");
    let o = run(&[
        "workload",
        "generate",
        "--requests",
        "12",
        "--input",
        "uniform:16:200",
        "--output",
        "uniform:2:20",
        "--arrival",
        "poisson:40",
        "--seed",
        "3",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --trace needs somewhere to write.
    let o = run(&[
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm",
        "--trace",
    ]);
    assert!(!o.status.success());
    let o = run(&[
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm",
        "--kv-capacity",
        "400",
        "--trace",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = out.join("vllm");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let mut rdr = csv::Reader::from_path(out.join("requests.csv")).unwrap();
    let mut requests = 0;
    for rec in rdr.deserialize::<std::collections::HashMap<String, String>>() {
        let rec = rec.unwrap();
        let id: u64 = rec["request"].parse().unwrap();
        let t = |k: &str| rec[k].parse::<f64>().unwrap() * 1e6;
        let slices: Vec<(f64, f64, String)> = events
            .iter()
            .filter(|e| e["pid"] == 2 && e["ph"] == "X" && e["tid"] == id)
            .map(|e| {
                let ts = e["ts"].as_f64().unwrap();
                (
                    ts,
                    ts + e["dur"].as_f64().unwrap(),
                    e["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert!(!slices.is_empty(), "request {id} has no track");
        // From arrival to completion without gaps, ending in the step that finishes it.
        assert!(
            (slices[0].0 - t("arrival_s")).abs() < 1e-3,
            "request {id}: {slices:?}"
        );
        assert!(
            (slices.last().unwrap().1 - t("completion_s")).abs() < 1e-3,
            "request {id}"
        );
        for pair in slices.windows(2) {
            assert!(
                (pair[1].0 - pair[0].1).abs() < 1e-3,
                "request {id}: gap in {slices:?}"
            );
        }
        assert!(
            slices.iter().any(|s| s.2 == "prefill"),
            "request {id}: {slices:?}"
        );
        let name = events
            .iter()
            .find(|e| e["name"] == "thread_name" && e["pid"] == 2 && e["tid"] == id)
            .unwrap();
        assert!(
            name["args"]["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("request {id} (I = "))
        );
        requests += 1;
    }
    assert_eq!(requests, 12);
    assert_eq!(trace["otherData"]["request_tracks"], 12);
}

#[test]
fn schedules_that_cannot_fit_in_memory_are_refused_before_anything_runs() {
    // 64 requests of 2^32 - 1 output tokens: every schedule has an entry per token, about
    // 20 TiB with its replay. solve and compare refuse at once with the numbers (before,
    // the portfolio's first simulation grew until the kernel killed the process), and
    // solve writes no file.
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let mut csv = String::from("arrived_at,num_prefill_tokens,num_decode_tokens\n");
    for i in 0..64 {
        csv.push_str(&format!("{}.0,8,4294967295\n", i));
    }
    std::fs::write(&w, csv).unwrap();
    let out = dir.path().join("solve");
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--kv-capacity",
        "5000000000",
        "--time-limit",
        "5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("too large") && e.contains("GiB is available") && e.contains("64 requests"),
        "{e}"
    );
    assert!(!out.join("schedule.json").exists());
    let o = run(&[
        "compare",
        "--workload",
        w.to_str().unwrap(),
        "--schedulers",
        "optimal,vllm,mcsf",
        "--kv-capacity",
        "5000000000",
        "--time-limit",
        "5",
        "--out",
        dir.path().join("compare").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    for name in ["optimal", "vllm", "mcsf"] {
        assert!(e.contains(&format!("{name}: too large")), "{name}: {e}");
    }
}

#[test]
fn simulate_on_replicas_writes_a_cluster_that_replay_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(60, dir.path());
    let out = dir.path().join("cluster");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            "vllm-v1",
            "--cost-model",
            "llama3-8b-h100-fa2",
            "--replicas",
            "3",
            "--router",
            "least-outstanding",
        ];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let o = bin()
        .args(args(&["--out", out.to_str().unwrap(), "--trace"]))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 replicas behind least-outstanding"),
        "{}",
        stdout(&o)
    );
    let out = out.join("vllm-v1");
    let routing = std::fs::read_to_string(out.join("routing.csv")).unwrap();
    assert_eq!(routing.lines().count(), 61);
    assert!(routing.starts_with("request,replica,routed_at_s\n0,0,"));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let per_replica = summary["cluster"]["per_replica"].as_array().unwrap();
    assert_eq!(per_replica.len(), 3);
    let routed: u64 = per_replica
        .iter()
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(routed, 60);
    for r in 0..3 {
        let s = std::fs::read_to_string(out.join(format!("replica-{r}/schedule.json"))).unwrap();
        assert!(s.contains("\"router\":\"least-outstanding\""), "{s:.200}");
    }
    // Each replica's Chrome trace names its own requests by the workload's ids.
    let on_replica_1: Vec<&str> = routing
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1) == Some("1"))
        .map(|l| l.split(',').next().unwrap())
        .collect();
    let trace_of =
        |r: usize| std::fs::read_to_string(out.join(format!("replica-{r}/trace.json"))).unwrap();
    let (t0, t1) = (trace_of(0), trace_of(1));
    let named = |t: &str, id: &str| t.contains(&format!("\"request {id} (I = "));
    assert!(!on_replica_1.is_empty());
    for id in on_replica_1 {
        assert!(named(&t1, id) && !named(&t0, id), "request {id}");
    }
    // The replay judges the folder on its own and computes the same metrics.
    let again = dir.path().join("replayed");
    let o = run(&[
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--cost-model",
        "llama3-8b-h100-fa2",
        "--token-budget",
        "8192",
        "--block-size",
        "16",
        "--kv-capacity",
        &summary["kv_capacity"].as_u64().unwrap().to_string(),
        "--cluster",
        out.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let replayed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(replayed["mean_e2e_s"], summary["mean_e2e_s"]);
    assert_eq!(
        replayed["cluster"]["per_replica"],
        summary["cluster"]["per_replica"]
    );
    // A schedule moved to another replica is caught, naming the request.
    let routing = routing.replacen("\n0,0,", "\n0,1,", 1);
    std::fs::write(out.join("routing.csv"), routing).unwrap();
    let o = run(&[
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--cost-model",
        "llama3-8b-h100-fa2",
        "--cluster",
        out.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("replica 0, batch 0: request 0 is routed to replica 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn simulate_refuses_a_cluster_it_cannot_build() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(4, dir.path());
    let w = w.to_str().unwrap();
    let o = run(&[
        "simulate",
        "--workload",
        w,
        "--scheduler",
        "vllm",
        "--replicas",
        "0",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--replicas"), "{}", stderr(&o));
    let o = run(&[
        "simulate",
        "--workload",
        w,
        "--scheduler",
        "vllm",
        "--replicas",
        "2",
        "--router",
        "nearest",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown router \"nearest\""),
        "{}",
        stderr(&o)
    );
    // More replicas than requests: the rest stay idle.
    let o = run(&[
        "simulate",
        "--workload",
        w,
        "--scheduler",
        "vllm",
        "--replicas",
        "6",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("6 replicas behind round-robin"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn capacity_searches_clusters_of_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(200, dir.path());
    let out = dir.path().join("cap");
    let o = run(&[
        "capacity",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm-v1",
        "--cost-model",
        "llama3-8b-h100-fa2",
        "--slo",
        "ttft-p90=300ms",
        "--replicas",
        "1,2",
        "--router",
        "round-robin,vllm-dp",
        "--disaggregate",
        "1:1",
        "--best-found",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("vllm-v1 on 2 replicas behind vllm-dp"),
        "{}",
        stdout(&o)
    );
    let text = std::fs::read_to_string(out.join("capacity.csv")).unwrap();
    assert!(
        text.starts_with("cost_model,scheduler,replicas,router,disaggregate,pp,token_budget,"),
        "{text}"
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let who: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[2], r[3], r[4])).collect();
    assert_eq!(
        who,
        [
            ("1", "", ""),
            ("2", "round-robin", ""),
            ("2", "vllm-dp", ""),
            ("2", "round-robin", "1:1"),
            ("2", "vllm-dp", "1:1")
        ]
    );
    let rate = |r: &Vec<&str>| -> f64 { r[11].parse().unwrap() };
    assert!(rows.iter().all(|r| r[10] == "found"), "{text}");
    // Prefill on one replica, decode on the other: a rate, and no ceiling claimed.
    for r in &rows[3..] {
        assert!(
            rate(r) > 0.0 && r[17].is_empty() && r[18].is_empty(),
            "{text}"
        );
    }
    assert!(
        stdout(&o).contains("vllm-v1 on 1 prefill and 1 decode replicas behind vllm-dp")
            && stdout(&o).contains("no ceiling (its argument covers colocated replicas)"),
        "{}",
        stdout(&o)
    );
    let rows = &rows[..3];
    // Two replicas sustain more than one.
    assert!(
        rate(&rows[1]) > rate(&rows[0]) && rate(&rows[2]) > rate(&rows[0]),
        "{text}"
    );
    // The ceiling no schedule passes lies above every rate a heuristic sustained.
    for r in rows {
        let ceiling: f64 = r[17].parse().unwrap();
        assert!(ceiling > rate(r), "{text}");
    }
    // --best-found: on one replica, a rate some schedule sustains, below the ceiling and
    // here above vLLM V1's; none searched for clusters.
    let best: f64 = rows[0][18].parse().unwrap();
    let ceiling: f64 = rows[0][17].parse().unwrap();
    assert!(rate(&rows[0]) < best && best < ceiling, "{text}");
    assert!(rows[1][18].is_empty() && rows[2][18].is_empty(), "{text}");
    assert!(
        stdout(&o).contains("some schedule meets them at"),
        "{}",
        stdout(&o)
    );
    // The plot of rate against GPUs, and the Pareto front said.
    assert!(out.join("capacity.svg").is_file());
    assert!(stdout(&o).contains("Pareto front"), "{}", stdout(&o));
    assert!(stdout(&o).contains("  2 GPUs: "), "{}", stdout(&o));
}

#[test]
fn solve_on_replicas_writes_a_cluster_with_a_bound_for_every_routing() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(8, dir.path());
    let out = dir.path().join("solved");
    let limits = [
        "--token-budget",
        "4096",
        "--kv-capacity",
        "32768",
        "--block-size",
        "16",
    ];
    let mut args = vec![
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--objective",
        "mean-latency",
        "--cost-model",
        "llama3-8b-h100-fa2",
        "--replicas",
        "2",
        "--time-limit",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(limits);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("valid for every routing"),
        "{}",
        stdout(&o)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("solve.json")).unwrap()).unwrap();
    assert_eq!(report["replicas"], 2);
    // Every heuristic behind every searched router.
    assert_eq!(
        report["candidates"].as_array().unwrap().len(),
        infersched::schedulers::SCHEDULER_NAMES.len()
            * infersched::solver::cluster::SEARCHED_ROUTERS.len()
    );
    let (value, bound) = (
        report["replayed_objective"].as_f64().unwrap(),
        report["best_bound"].as_f64().unwrap(),
    );
    assert!(bound > 0.0 && bound <= value, "{report}");
    let status = report["status"].as_str().unwrap();
    assert!(status == "optimal" || status == "not-proven", "{report}");
    // Its folder replays to the same objective.
    let again = dir.path().join("again");
    let mut args = vec![
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--cost-model",
        "llama3-8b-h100-fa2",
        "--cluster",
        out.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ];
    args.extend(limits);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("summary.json")).unwrap())
            .unwrap();
    assert!((s["mean_e2e_s"].as_f64().unwrap() - value).abs() <= 1e-12 * value);
    // Policy classes are not searched across replicas: said, not ignored.
    let o = run(&[
        "solve",
        "--workload",
        w.to_str().unwrap(),
        "--replicas",
        "2",
        "--no-evict",
        "--out",
        dir.path().join("x").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not searched across replicas"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn compare_brackets_the_best_possible_goodput_with_a_schedule_found_and_a_proof() {
    // 80 real requests at ten times their rate: the GPU cannot serve all in time.
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let trace = root().join("notebooks-data/traces/splitwise_code.csv");
    let o = run(&[
        "workload",
        "sample",
        "--trace",
        trace.to_str().unwrap(),
        "--first",
        "80",
        "--time-scale",
        "0.1",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("cmp");
    let o = run(&[
        "compare",
        "--workload",
        w.to_str().unwrap(),
        "--schedulers",
        "vllm-v1,sarathi",
        "--no-plots",
        "--no-traces",
        "--slo",
        "ttft-p90=1s",
        "--slo",
        "tbt-p99=100ms",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
            .unwrap();
    let most = doc["most_requests_meeting_slos"].as_u64().unwrap();
    let found = doc["best_found_meeting_slos"].as_u64().unwrap();
    assert!(found <= most, "{found} > {most}");
    // The search beats both schedulers here, and says so.
    let by = doc["best_found_meeting_slos_by"].as_str().unwrap();
    assert!(by.starts_with("goodput search (priority list"), "{by}");
    for row in doc["rows"].as_array().unwrap() {
        let theirs = (row["slo_attainment"].as_f64().unwrap() * 80.0).round() as u64;
        assert!(theirs < found, "{row}");
    }
    assert!(
        stdout(&o).contains(&format!(
            "the best possible: between {found} (found by goodput search"
        )),
        "{}",
        stdout(&o)
    );
    // Its schedule, replayed on its own, meets them for as many requests.
    let o = run(&[
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--schedule",
        out.join("goodput-search/schedule.json").to_str().unwrap(),
        "--slo",
        "ttft-p90=1s",
        "--slo",
        "tbt-p99=100ms",
        "--out",
        dir.path().join("r").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("meet every SLO ({found})")),
        "{}",
        stdout(&o)
    );
    // solve --objective goodput: the same search and bound, with the certified gap.
    let solved = dir.path().join("solve");
    let args = |slos: &[&'static str]| {
        let mut v = vec![
            "solve",
            "--workload",
            w.to_str().unwrap(),
            "--objective",
            "goodput",
            "--out",
            solved.to_str().unwrap(),
        ];
        for s in slos {
            v.extend(["--slo", s]);
        }
        v
    };
    let o = run(&args(&["ttft-p90=1s", "tbt-p99=100ms"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(solved.join("solve.json")).unwrap()).unwrap();
    assert_eq!(doc["meeting"].as_u64(), Some(found), "{doc}");
    assert_eq!(doc["bound"].as_u64(), Some(most), "{doc}");
    assert_eq!(doc["clairvoyant"], true);
    let gap = (most - found) as f64 / most as f64;
    assert!(
        (doc["certified_gap"].as_f64().unwrap() - gap).abs() < 1e-12,
        "{doc}"
    );
    let status = if found == most {
        "optimal"
    } else {
        "not-proven"
    };
    assert_eq!(doc["status"], status, "{doc}");
    let summary = std::fs::read_to_string(solved.join("summary.json")).unwrap();
    assert!(
        summary.contains(&format!("\"good_requests\": {found}")),
        "{summary}"
    );
    assert!(solved.join("schedule.json").is_file());
    // Without an SLO there is nothing to count; constraints belong to the other objectives.
    let o = run(&args(&[]));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("give at least one --slo"),
        "{}",
        stderr(&o)
    );
    let mut constrained = args(&["ttft-p90=1s"]);
    constrained.extend(["--subject-to", "tpot-max=1s"]);
    let o = run(&constrained);
    assert!(
        stderr(&o).contains("--subject-to constrains"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn solve_subject_to_slos_keeps_only_schedules_meeting_them() {
    // 8 real requests at ten times their rate, little KV: the mean-TTFT optimum found
    // evicts and stalls decodes far past a 30 ms TPOT.
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w.csv");
    let trace = root().join("notebooks-data/traces/splitwise_code.csv");
    let o = run(&[
        "workload",
        "sample",
        "--trace",
        trace.to_str().unwrap(),
        "--first",
        "8",
        "--time-scale",
        "0.1",
        "--max-total-tokens",
        "4096",
        "--out",
        w.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let solve = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec![
            "solve",
            "--workload",
            w.to_str().unwrap(),
            "--objective",
            "mean-ttft",
            "--cost-model",
            "llama2-7b-a100",
            "--token-budget",
            "4096",
            "--kv-capacity",
            "8192",
            "--block-size",
            "16",
            "--time-limit",
            "2",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        (run(&args), out)
    };
    let json = |path: std::path::PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (o, plain) = solve("plain", &["--slo", "tpot-max=30ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(plain.join("summary.json"))["slo"]["all_hold"], false);
    let (o, kept) = solve("kept", &["--subject-to", "tpot-max=30ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = json(kept.join("summary.json"));
    assert_eq!(summary["slo"]["all_hold"], true, "{summary}");
    let doc = json(kept.join("solve.json"));
    assert_eq!(doc["subject_to"][0], "tpot-max=0.03s");
    let (value, bound) = (
        doc["replayed_objective"].as_f64().unwrap(),
        doc["best_bound"].as_f64().unwrap(),
    );
    assert!(
        bound <= value && (summary["mean_ttft_s"].as_f64().unwrap() - value).abs() < 1e-12,
        "{doc}"
    );
    let proven = value <= bound * (1.0 + 1e-9);
    assert_eq!(
        doc["status"],
        if proven { "optimal" } else { "not-proven" },
        "{doc}"
    );
    let (tried, feasible) = (
        doc["tried"].as_u64().unwrap(),
        doc["feasible"].as_u64().unwrap(),
    );
    assert!(0 < feasible && feasible < tried, "{doc}");
    // No schedule tried meets an impossible constraint: said, nothing written; and one
    // replica only.
    let (o, none) = solve("none", &["--subject-to", "ttft-max=1us"]);
    assert!(
        stderr(&o).contains("meets every --subject-to"),
        "{}",
        stderr(&o)
    );
    assert!(!none.exists());
    let (o, _) = solve(
        "cluster",
        &["--subject-to", "tpot-max=30ms", "--replicas", "2"],
    );
    assert!(
        stderr(&o).contains("--subject-to is solved on one replica"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn compare_and_solve_measure_slos() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let w = example("arxiv-4.csv");
    let o = run(&[
        "compare",
        "--workload",
        &w,
        "--schedulers",
        "optimal,vllm,orca",
        "--objective",
        "mean-latency",
        "--kv-capacity",
        "64",
        "--time-limit",
        "5",
        "--no-plots",
        "--no-traces",
        "--slo",
        "e2e-max=1ms",
        "--slo",
        "ttft-p50=10s",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("SLOs (attainment"), "{}", stdout(&o));
    let mut rdr = csv::Reader::from_path(out.join("comparison.csv")).unwrap();
    let header = rdr.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    for row in rdr.records() {
        let row = row.unwrap();
        // No request ends within 1 ms: none meets every SLO, and e2e-max misses.
        assert_eq!(&row[col("slo_attainment")], "0", "{row:?}");
        assert_eq!(&row[col("slos_hold")], "false", "{row:?}");
        // ... and no schedule can do better: the bound is 0 requests, no share is given.
        assert_eq!(&row[col("goodput_of_best_possible")], "", "{row:?}");
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("comparison.json")).unwrap())
            .unwrap();
    assert_eq!(doc["most_requests_meeting_slos"], 0);
    // A loose deadline: every request can meet it, and each scheduler's share is its own.
    let loose = dir.path().join("loose");
    let o = run(&[
        "compare",
        "--workload",
        &w,
        "--schedulers",
        "vllm,orca",
        "--kv-capacity",
        "64",
        "--no-plots",
        "--no-traces",
        "--slo",
        "e2e-max=100s",
        "--out",
        loose.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no schedule at all has more than 4 of the 4 requests"),
        "{}",
        stdout(&o)
    );
    let mut rdr = csv::Reader::from_path(loose.join("comparison.csv")).unwrap();
    for row in rdr.records() {
        let row = row.unwrap();
        assert_eq!(&row[col("goodput_of_best_possible")], "1", "{row:?}");
    }
    // Without --slo the columns are empty.
    let plain = dir.path().join("plain");
    let o = run(&[
        "compare",
        "--workload",
        &w,
        "--schedulers",
        "vllm",
        "--kv-capacity",
        "64",
        "--no-plots",
        "--no-traces",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(plain.join("comparison.csv")).unwrap();
    // The four SLO columns are empty; then cached_tokens (0) and router (none).
    assert!(
        text.lines().nth(1).unwrap().ends_with("false,,,,,0,"),
        "{text}"
    );
    // solve measures them too.
    let solved = dir.path().join("solved");
    let o = run(&[
        "solve",
        "--workload",
        &w,
        "--kv-capacity",
        "64",
        "--time-limit",
        "5",
        "--slo",
        "ttft-p50=10s",
        "--out",
        solved.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(solved.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(s["slo"]["attainment"], 1.0, "{s}");
}

#[test]
fn a_disaggregated_cluster_prefills_on_one_side_decodes_on_the_other_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(40, dir.path());
    let out = dir.path().join("dis");
    let limits = [
        "--cost-model",
        "llama3-8b-h100",
        "--token-budget",
        "2048",
        "--kv-capacity",
        "65536",
        "--block-size",
        "16",
        "--kv-latency-us",
        "20",
    ];
    let mut args = vec![
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm-v1",
        "--disaggregate",
        "1:2",
        "--router",
        "least-outstanding",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(&limits);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("1 prefill and 2 decode replicas behind least-outstanding"),
        "{text}"
    );
    assert!(
        text.contains("prefill 0") && text.contains("decode 1"),
        "{text}"
    );
    let run_dir = out.join("vllm-v1");
    // Every request routed once on each side; its KV ready after it arrived, and its
    // first token (the decode side's) after that.
    let routing = std::fs::read_to_string(run_dir.join("routing.csv")).unwrap();
    let mut lines = routing.lines();
    assert_eq!(
        lines.next(),
        Some("request,prefill_replica,routed_at_s,kv_ready_s,decode_replica")
    );
    let requests = std::fs::read_to_string(run_dir.join("requests.csv")).unwrap();
    let mut decoded_on = [0; 2];
    for (row, rec) in lines.zip(requests.lines().skip(1)) {
        let f: Vec<&str> = row.split(',').collect();
        let r: Vec<&str> = rec.split(',').collect();
        assert_eq!((f[0], f[1]), (r[0], "0"), "{row}");
        let (arrival, ready): (f64, f64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let first_token: f64 = r[5].parse().unwrap();
        assert!(arrival < ready && ready < first_token, "{row} / {rec}");
        assert_eq!(r[3], f[2], "the cluster's arrival is the request's own");
        decoded_on[f[4].parse::<usize>().unwrap()] += 1;
    }
    assert_eq!(decoded_on[0] + decoded_on[1], 40);
    assert!(decoded_on.iter().all(|&n| n > 0), "{decoded_on:?}");
    // On the decode side each request first receives all but its last prompt token
    // (pulled, nixl: a receive entry, then that token computed), or takes them pushed
    // (p2p-nccl: one entry computing the last prompt token).
    let prompts: Vec<u64> = requests
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    let first_entries = |run_dir: &Path| -> Vec<(u64, serde_json::Value)> {
        let mut firsts = Vec::new();
        for k in 0..2 {
            let path = run_dir.join(format!("decode/replica-{k}/schedule.json"));
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            assert_eq!(s["meta"]["side"], "decode");
            let mut seen = std::collections::HashMap::new();
            for e in s["batches"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|b| b["entries"].as_array().unwrap())
            {
                let id = e["request"].as_u64().unwrap();
                let n = seen.entry(id).or_insert(0);
                *n += 1;
                if *n <= 2 {
                    firsts.push((id, e.clone()));
                }
            }
        }
        firsts
    };
    let mut received = 0;
    for (id, e) in first_entries(&run_dir) {
        let prompt = prompts[id as usize];
        match e["receive"].as_u64() {
            Some(h) => {
                assert_eq!(h, prompt - 1, "{e}");
                received += 1;
            }
            None => assert_eq!(
                (e["tokens"].as_u64(), e.get("cached")),
                (Some(1), None),
                "{e}"
            ),
        }
    }
    assert_eq!(received, 40);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["cluster"]["replicas"], 3);
    assert_eq!(summary["cluster"]["prefill_replicas"], 1);
    assert_eq!(
        summary["cluster"]["kv_link"]["bandwidth_bytes_per_s"],
        450e9
    );
    // The replay of the folder gives the same files; a different link does not replay.
    let again = dir.path().join("again");
    let mut replay = vec![
        "replay",
        "--workload",
        w.to_str().unwrap(),
        "--cluster",
        run_dir.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ];
    replay.extend_from_slice(&limits);
    let o = run(&replay);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in [
        "requests.csv",
        "summary.json",
        "routing.csv",
        "decode/requests.csv",
    ] {
        assert_eq!(
            std::fs::read(run_dir.join(f)).unwrap(),
            std::fs::read(again.join(f)).unwrap(),
            "{f}"
        );
    }
    let slower = dir.path().join("slower");
    let mut bad = replay.clone();
    bad[6] = slower.to_str().unwrap();
    bad.extend_from_slice(&["--kv-bandwidth", "10"]);
    assert_fails(
        &bad,
        &slower,
        &["not a valid disaggregated cluster", "the decode side"],
    );
    // Pushed (p2p-nccl): the decode side takes the KV at its first processing entry, and
    // its folder replays too (the replay reads which from the schedules).
    let pushed = dir.path().join("pushed");
    let mut push = args.clone();
    push[10] = pushed.to_str().unwrap();
    push.extend_from_slice(&["--kv-connector", "p2p-nccl"]);
    let o = run(&push);
    assert!(o.status.success(), "{}", stderr(&o));
    let pushed_dir = pushed.join("vllm-v1");
    let mut seen = std::collections::HashSet::new();
    for (id, e) in first_entries(&pushed_dir) {
        if seen.insert(id) {
            assert_eq!(e["cached"].as_u64(), Some(prompts[id as usize] - 1), "{e}");
            assert_eq!(e["tokens"].as_u64(), Some(1), "{e}");
        }
    }
    assert_eq!(seen.len(), 40);
    let again = dir.path().join("pushed-again");
    let mut replay = replay.clone();
    replay[4] = pushed_dir.to_str().unwrap();
    replay[6] = again.to_str().unwrap();
    let o = run(&replay);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(pushed_dir.join("requests.csv")).unwrap(),
        std::fs::read(again.join("requests.csv")).unwrap()
    );
}

#[test]
fn disaggregation_refuses_what_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(5, dir.path());
    let out = dir.path().join("out");
    let base = |extra: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    for (extra, expect) in [
        (
            &["--scheduler", "vllm-v1", "--disaggregate", "0:2"][..],
            "expected P:D",
        ),
        (
            &["--scheduler", "vllm-v1", "--disaggregate", "2"][..],
            "expected P:D",
        ),
        (
            &["--scheduler", "sarathi", "--disaggregate", "1:1"][..],
            "sarathi does not take KV computed elsewhere",
        ),
        (
            &["--scheduler", "vllm-v1", "--router", "least-kv"][..],
            "give --replicas N or --disaggregate P:D",
        ),
        (
            &[
                "--scheduler",
                "vllm-v1",
                "--disaggregate",
                "1:1",
                "--replicas",
                "2",
            ][..],
            "cannot be used with",
        ),
        (
            &[
                "--scheduler",
                "vllm-v1",
                "--disaggregate",
                "1:1",
                "--kv-bandwidth",
                "0",
            ][..],
            "bandwidth must be positive",
        ),
        (
            &["--scheduler", "vllm-v1", "--kv-bandwidth", "10"][..],
            "--disaggregate",
        ),
    ] {
        let args = base(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_fails(&args, &out, &[expect]);
    }
}

#[test]
fn a_pipelined_replica_overlaps_batches_replays_and_refuses_what_it_does_not_model() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(60, dir.path());
    let sim = |pp: &str, out: &Path| {
        let o = run(&[
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            "vllm-v1",
            "--cost-model",
            "roofline:h100:llama3-8b",
            "--pp",
            pp,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let summary = std::fs::read_to_string(out.join("vllm-v1/summary.json")).unwrap();
        (
            stdout(&o),
            serde_json::from_str::<serde_json::Value>(&summary).unwrap(),
        )
    };
    let (one_text, one) = sim("1", &dir.path().join("pp1"));
    let (two_text, two) = sim("2", &dir.path().join("pp2"));
    assert!(!one_text.contains("pipeline") && one.get("pipeline").is_none());
    assert!(
        two_text.contains("pipeline              2 stages, each send 7.2 us + 36.41 ns per token"),
        "{two_text}"
    );
    assert_eq!(two["pipeline"]["stages"], 2);
    // Each stage GPU holds half the layers: more than twice the KV of one GPU.
    let m = |s: &serde_json::Value| s["kv_capacity"].as_u64().unwrap();
    assert!(m(&two) > 2 * m(&one), "{} -> {}", m(&one), m(&two));
    // Batches overlap: arrivals start in stage 0 while a batch is in stage 1.
    let f = |s: &serde_json::Value, k: &str| s[k].as_f64().unwrap();
    assert!(f(&two, "mean_ttft_s") < f(&one, "mean_ttft_s"));
    let batches = std::fs::read_to_string(dir.path().join("pp2/vllm-v1/batches.csv")).unwrap();
    let spans: Vec<(f64, f64)> = batches
        .lines()
        .skip(1)
        .map(|l| {
            let c: Vec<f64> = l
                .split(',')
                .skip(1)
                .take(2)
                .map(|x| x.parse().unwrap())
                .collect();
            (c[0], c[1])
        })
        .collect();
    assert!(
        spans.windows(2).any(|p| p[1].0 < p[0].1),
        "no batch overlaps the one before"
    );
    // The replay on the same pipeline writes the same summary; on one GPU it refuses the
    // claimed times.
    let schedule = dir.path().join("pp2/vllm-v1/schedule.json");
    let replay = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "replay",
            "--workload",
            w.to_str().unwrap(),
            "--schedule",
            schedule.to_str().unwrap(),
            "--cost-model",
            "roofline:h100:llama3-8b",
            "--token-budget",
            "8192",
            "--max-running",
            "256",
            "--block-size",
            "16",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let r = replay(&["--pp", "2"], &dir.path().join("r2"));
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(
        std::fs::read(dir.path().join("r2/summary.json")).unwrap(),
        std::fs::read(dir.path().join("pp2/vllm-v1/summary.json")).unwrap()
    );
    let m2 = m(&two).to_string();
    let r = replay(&["--kv-capacity", &m2], &dir.path().join("r1"));
    assert!(
        !r.status.success() && stderr(&r).contains("claimed end_s"),
        "{}",
        stderr(&r)
    );
    // A cluster of pipelined replicas, colocated or disaggregated: its folder replays on
    // the same pipeline to the same bytes.
    let round_trip = |shape: &[&str], name: &str, files: &[&str]| {
        let made = dir.path().join(name);
        let mut args = vec![
            "simulate",
            "--workload",
            w.to_str().unwrap(),
            "--scheduler",
            "vllm-v1",
            "--cost-model",
            "roofline:h100:llama3-8b",
            "--pp",
            "2",
            "--out",
            made.to_str().unwrap(),
        ];
        args.extend_from_slice(shape);
        let o = run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let again = dir.path().join(format!("{name}-replayed"));
        let r = run(&[
            "replay",
            "--workload",
            w.to_str().unwrap(),
            "--cluster",
            made.join("vllm-v1").to_str().unwrap(),
            "--cost-model",
            "roofline:h100:llama3-8b",
            "--token-budget",
            "8192",
            "--max-running",
            "256",
            "--block-size",
            "16",
            "--pp",
            "2",
            "--out",
            again.to_str().unwrap(),
        ]);
        assert!(r.status.success(), "{}", stderr(&r));
        for f in files {
            assert_eq!(
                std::fs::read(again.join(f)).unwrap(),
                std::fs::read(made.join("vllm-v1").join(f)).unwrap(),
                "{f}"
            );
        }
        (
            stdout(&o),
            std::fs::read_to_string(made.join("vllm-v1/summary.json")).unwrap(),
        )
    };
    let (text, _) = round_trip(
        &["--replicas", "2"],
        "cluster",
        &["summary.json", "replica-1/summary.json", "requests.csv"],
    );
    // vLLM v0's virtual engines on every replica of a cluster.
    let engines = dir.path().join("engines");
    let o = run(&[
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--scheduler",
        "vllm",
        "--cost-model",
        "roofline:h100:llama3-8b",
        "--pp",
        "2",
        "--replicas",
        "2",
        "--out",
        engines.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = std::fs::read_to_string(engines.join("vllm/replica-1/schedule.json")).unwrap();
    assert!(
        meta.contains("\"virtual_engines\":2"),
        "{}",
        &meta[..200.min(meta.len())]
    );
    assert!(
        text.contains("2 replicas") && text.contains("2 stages"),
        "{text}"
    );
    let (_, summary) = round_trip(
        &["--disaggregate", "1:1"],
        "split",
        &[
            "summary.json",
            "decode/replica-0/summary.json",
            "routing.csv",
        ],
    );
    assert!(summary.contains("\"pipeline\""), "{summary}");
    // Refused, naming the flag, with nothing written.
    let out = dir.path().join("refused");
    let base = [
        "simulate",
        "--workload",
        w.to_str().unwrap(),
        "--cost-model",
        "roofline:h100:llama3-8b",
        "--out",
        out.to_str().unwrap(),
    ];
    for (extra, expect) in [
        (
            &["--scheduler", "orca", "--pp", "2"][..],
            "Vidur's micro-batches), not orca",
        ),
        (
            &["--scheduler", "vllm-v1", "--pp", "33"][..],
            "--pp 33: llama3-8b has 32 layers",
        ),
        (&["--scheduler", "vllm-v1", "--pp", "0"][..], "--pp"),
        (
            &["--scheduler", "vllm-v1", "--pp-latency-us", "5"][..],
            "give --pp 2 or more",
        ),
        (
            &["--scheduler", "vllm-v1", "--pp", "2", "--pp-bandwidth", "0"][..],
            "--pp-bandwidth: expected GB/s > 0",
        ),
        (
            &[
                "--scheduler",
                "vllm-v1",
                "--pp",
                "2",
                "--pp-latency-us",
                "NaN",
            ][..],
            "finite number",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_fails(&args, &out, &[expect]);
    }
}

#[test]
fn capacity_searches_pipelined_replicas_with_their_first_stages_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let w = first_splitwise_requests(200, dir.path());
    let out = dir.path().join("cap");
    let args = |extra: &[&str], out: &Path| {
        let mut a: Vec<String> = [
            "capacity",
            "--workload",
            w.to_str().unwrap(),
            "--cost-model",
            "roofline:h100:llama3-8b",
            "--slo",
            "ttft-p90=300ms",
            "--out",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let a = args(&["--scheduler", "vllm-v1,sarathi", "--pp", "1,2"], &out);
    let o = run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("capacity.csv")).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    // (scheduler, pp) in configuration order, M per stage GPU, a rate for each.
    let who: Vec<(&str, &str)> = rows.iter().map(|r| (r[1], r[5])).collect();
    assert_eq!(
        who,
        [
            ("vllm-v1", ""),
            ("sarathi", ""),
            ("vllm-v1", "2"),
            ("sarathi", "2")
        ]
    );
    let m = |r: &Vec<&str>| r[9].parse::<u64>().unwrap();
    assert!(m(&rows[2]) > 2 * m(&rows[0]), "{text}");
    for r in &rows {
        assert_eq!(r[10], "found", "{text}");
    }
    // Each configuration's ceiling lies above the rate it sustains; a pipeline's (its
    // first stage's, at half the time per batch) above one replica's.
    let x = |r: &Vec<&str>, k: usize| r[k].parse::<f64>().unwrap();
    for r in &rows {
        assert!(x(r, 17) >= x(r, 11), "{text}");
    }
    assert!(x(&rows[2], 17) > x(&rows[0], 17), "{text}");
    assert!(
        stdout(&o).contains("vllm-v1, 2 pipeline stages each") && stdout(&o).contains("(ceiling)"),
        "{}",
        stdout(&o)
    );
    // Refused before anything runs.
    let bad = dir.path().join("bad");
    let a = args(&["--scheduler", "orca", "--pp", "2"], &bad);
    assert_fails(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        &bad,
        &["not orca"],
    );
}
