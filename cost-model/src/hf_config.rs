//! Dense decoder shapes from a Hugging Face `config.json` (`--cost-model
//! roofline:GPU:path/to/config.json`, `calibrate --model path/to/config.json`): the fields
//! every Llama-style model card carries, read into a [`ModelSpec`].

use crate::hardware::ModelSpec;
use serde::Deserialize;

/// The fields of a `config.json` the roofline model needs (others are ignored).
#[derive(Deserialize)]
struct HfConfig {
    hidden_size: u32,
    num_hidden_layers: u32,
    num_attention_heads: u32,
    num_key_value_heads: Option<u32>,
    head_dim: Option<u32>,
    intermediate_size: u32,
    vocab_size: u32,
    torch_dtype: Option<String>,
    /// Mixture-of-experts fields (refused: the roofline is for dense models).
    num_local_experts: Option<u32>,
    num_experts: Option<u32>,
    n_routed_experts: Option<u32>,
}

/// Bytes per element of a `torch_dtype` (fp16/bf16 when absent).
fn dtype_bytes(dtype: Option<&str>) -> Result<u32, String> {
    match dtype.unwrap_or("bfloat16") {
        "float16" | "bfloat16" | "half" => Ok(2),
        "float32" | "float" => Ok(4),
        other => Err(format!(
            "torch_dtype \"{other}\": expected float16, bfloat16 or float32"
        )),
    }
}

/// The model shape `name` from the text of a Hugging Face `config.json`: layers
/// (`num_hidden_layers`), hidden size, heads, KV heads (`num_key_value_heads`, the heads
/// where absent), head dimension (`head_dim`, else hidden size over heads), MLP width
/// (`intermediate_size`, a gated MLP), vocabulary and `torch_dtype`. Refuses
/// mixture-of-experts configs and shapes that do not fit together, naming the field.
pub fn model_from_hf_config(text: &str, name: &str) -> Result<ModelSpec, String> {
    let c: HfConfig = serde_json::from_str(text).map_err(|e| {
        format!("not a Hugging Face config.json of a dense decoder (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size): {e}")
    })?;
    if let Some(n) = c.num_local_experts.or(c.num_experts).or(c.n_routed_experts) {
        return Err(format!(
            "a mixture-of-experts model ({n} experts): the roofline models dense decoders only"
        ));
    }
    for (field, v) in [
        ("hidden_size", c.hidden_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("intermediate_size", c.intermediate_size),
        ("vocab_size", c.vocab_size),
    ] {
        if v == 0 {
            return Err(format!("{field} must be >= 1"));
        }
    }
    let heads = c.num_attention_heads;
    let kv_heads = c.num_key_value_heads.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "num_key_value_heads {kv_heads} must divide num_attention_heads {heads}"
        ));
    }
    let head_dim = match c.head_dim {
        Some(d) if d >= 1 => d,
        Some(_) => return Err("head_dim must be >= 1".into()),
        None if c.hidden_size.is_multiple_of(heads) => c.hidden_size / heads,
        None => {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {heads} and there is no head_dim",
                c.hidden_size
            ));
        }
    };
    Ok(ModelSpec {
        name: name.to_string(),
        layers: c.num_hidden_layers,
        hidden: c.hidden_size,
        heads,
        kv_heads,
        head_dim,
        mlp_hidden: c.intermediate_size,
        vocab: c.vocab_size,
        dtype_bytes: dtype_bytes(c.torch_dtype.as_deref())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped(name: &str) -> String {
        let path = format!(
            "{}/../notebooks-data/models/{name}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn the_shipped_configs_give_the_built_in_shapes() {
        for (name, built_in) in [
            ("llama2-7b", ModelSpec::llama2_7b()),
            ("llama3-8b", ModelSpec::llama3_8b()),
            ("llama3-70b", ModelSpec::llama3_70b()),
        ] {
            let m = model_from_hf_config(&shipped(name), name).unwrap();
            assert_eq!(m, built_in, "{name}");
            assert_eq!(m.parameters(), built_in.parameters());
        }
    }

    #[test]
    fn bad_configs_name_what_is_wrong() {
        let e = model_from_hf_config("{\"hidden_size\": 8}", "x").unwrap_err();
        assert!(e.contains("not a Hugging Face config.json"), "{e}");
        let moe = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
            "num_local_experts": 8}"#;
        assert!(
            model_from_hf_config(moe, "x")
                .unwrap_err()
                .contains("mixture-of-experts")
        );
        let gqa = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 5, "intermediate_size": 14336, "vocab_size": 32000}"#;
        assert!(
            model_from_hf_config(gqa, "x")
                .unwrap_err()
                .contains("num_key_value_heads 5")
        );
        let dtype = r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 14336, "vocab_size": 32000, "torch_dtype": "int4"}"#;
        assert!(
            model_from_hf_config(dtype, "x")
                .unwrap_err()
                .contains("torch_dtype \"int4\"")
        );
        // An explicit head_dim wins over hidden / heads (e.g. Gemma, Qwen3).
        let hd = r#"{"hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
            "vocab_size": 1000, "torch_dtype": "float32"}"#;
        let m = model_from_hf_config(hd, "x").unwrap();
        assert_eq!((m.head_dim, m.dtype_bytes, m.kv_heads), (128, 4, 4));
    }
}
