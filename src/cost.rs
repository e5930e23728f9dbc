//! Prices and the hard cost cap of a run (SPEC §7).
//!
//! Prices live in `config/pricing.toml` (compiled in) and optionally in a user file that
//! replaces or adds entries. A model without a price is refused: its cap could not be kept.
//!
//! The cap: before every model call the agent asks [`Budget::plan_call`] for the largest
//! `max_tokens` whose worst case (every prompt token billed at the dearest prompt price, plus
//! `max_tokens` of output) still fits in what is left of the limit; after the call
//! [`Budget::record`] adds the exact cost from the provider's usage. Since the actual usage of
//! a call can never exceed its planned worst case, the spend never exceeds the limit.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::model::{Block, Message, Request, Usage};

/// The prices shipped with kodx.
const BUILTIN_TOML: &str = include_str!("../config/pricing.toml");
/// How the shipped file is named in errors.
const BUILTIN_SOURCE: &str = "config/pricing.toml (built in)";

/// Tokens per million: prices are quoted per million tokens.
const MILLION: f64 = 1_000_000.0;

/// Prices of one model, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached prompt tokens.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens written to the prompt cache.
    pub cache_write: f64,
    /// Prompt tokens read from the prompt cache.
    pub cache_read: f64,
}

impl Price {
    /// The exact cost in USD of a call's usage: each token kind counted once, at its own
    /// price (`input_tokens` excludes the cached tokens, see [`Usage`]).
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input
            + usage.output_tokens as f64 * self.output
            + usage.cache_write_tokens as f64 * self.cache_write
            + usage.cache_read_tokens as f64 * self.cache_read)
            / MILLION
    }

    /// The dearest price a prompt token can be billed at: whether a prompt token ends up
    /// uncached, written to the cache or read from it is the provider's decision, so the
    /// worst case assumes the dearest of the three (normally the cache-write price).
    pub fn prompt_worst(&self) -> f64 {
        self.input.max(self.cache_write).max(self.cache_read)
    }

    /// The dearest price of a prompt token that cannot be written to the cache (one after
    /// the request's last cache breakpoint): uncached or read, never written.
    pub fn prompt_unwritten(&self) -> f64 {
        self.input.max(self.cache_read)
    }

    fn check(&self) -> Result<(), String> {
        for (key, value) in [
            ("input", self.input),
            ("output", self.output),
            ("cache_write", self.cache_write),
            ("cache_read", self.cache_read),
        ] {
            if !value.is_finite() {
                return Err(format!("`{key}` is {value}, not a finite number"));
            }
            if value < 0.0 {
                return Err(format!("`{key}` is {value}, a price cannot be negative"));
            }
        }
        Ok(())
    }
}

/// Why a price could not be had.
#[derive(Debug)]
pub enum CostError {
    /// The model is not in the pricing table.
    NoPrice { model: String },
    /// A pricing file could not be read or is not a valid pricing table. `source` names
    /// the file.
    Invalid { source: String, message: String },
}

// Display and Error by hand rather than with thiserror: thiserror treats a field named
// `source` as the underlying error, which a `String` is not.
impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::NoPrice { model } => write!(
                f,
                "no price for model `{model}`, so its cost limit could not be kept; add it \
                 with its four prices in USD per million tokens (input, output, cache_write, \
                 cache_read) as a [models.\"{model}\"] table to a pricing file passed with \
                 --pricing or KODX_PRICING, or to config/pricing.toml"
            ),
            CostError::Invalid { source, message } => {
                write!(f, "invalid pricing file {source}: {message}")
            }
        }
    }
}

impl std::error::Error for CostError {}

/// The shape of a pricing file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PricingFile {
    #[serde(default)]
    models: BTreeMap<String, Price>,
}

/// Prices per model name.
#[derive(Debug, Clone, PartialEq)]
pub struct Pricing {
    models: BTreeMap<String, Price>,
}

impl Pricing {
    /// The prices shipped in `config/pricing.toml`, parsed once.
    ///
    /// Panics only if the shipped file is broken, which a unit test rules out.
    pub fn builtin() -> Pricing {
        static BUILTIN: OnceLock<Pricing> = OnceLock::new();
        BUILTIN
            .get_or_init(|| match Pricing::from_toml(BUILTIN_TOML, BUILTIN_SOURCE) {
                Ok(pricing) => pricing,
                Err(e) => panic!("{e}"),
            })
            .clone()
    }

    /// Parses a pricing file. `source` names it in errors. Unknown keys, missing keys,
    /// negative and non-finite prices are refused.
    pub fn from_toml(text: &str, source: &str) -> Result<Pricing, CostError> {
        let invalid = |message: String| CostError::Invalid {
            source: source.to_string(),
            message,
        };
        let file: PricingFile =
            toml::from_str(text).map_err(|e| invalid(e.to_string().trim_end().to_string()))?;
        for (name, price) in &file.models {
            if name.trim().is_empty() {
                return Err(invalid("a model has an empty name".to_string()));
            }
            price
                .check()
                .map_err(|m| invalid(format!("model `{name}`: {m}")))?;
        }
        Ok(Pricing {
            models: file.models,
        })
    }

    /// Reads and parses a pricing file (the `--pricing` / `KODX_PRICING` file).
    pub fn from_file(path: &Path) -> Result<Pricing, CostError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| CostError::Invalid {
            source: source.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Pricing::from_toml(&text, &source)
    }

    /// These prices with `overrides`' entries replacing or adding to them.
    pub fn merged(mut self, overrides: Pricing) -> Pricing {
        self.models.extend(overrides.models);
        self
    }

    /// The price of `model`, by exact name. There is no fuzzy matching (a dated name is not
    /// guessed from its alias or the reverse): a model with no entry is refused.
    pub fn price(&self, model: &str) -> Result<Price, CostError> {
        self.models
            .get(model)
            .copied()
            .ok_or_else(|| CostError::NoPrice {
                model: model.to_string(),
            })
    }

    /// The priced models, by name.
    pub fn models(&self) -> impl Iterator<Item = (&str, &Price)> {
        self.models
            .iter()
            .map(|(name, price)| (name.as_str(), price))
    }
}

/// The safety margin of the cap, in USD.
///
/// Money is computed in f64. The rounding error of the sums here is around 1e-16 of the
/// amounts involved, so a plan is accepted only when `spent + worst case + margin <= limit`
/// with a margin of a nanodollar plus 1e-12 of the limit: many orders of magnitude above the
/// float error, many below a cent. A worst case can therefore never cross the limit through
/// rounding; the margin errs on the safe side (it may refuse a call that would have fitted
/// to the nanodollar).
fn safety_margin(limit: f64) -> f64 {
    1e-9 + 1e-12 * limit.abs()
}

/// The hard cap of one run (SPEC §7): spend never exceeds the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    limit_usd: f64,
    spent_usd: f64,
    price: Price,
    /// How many of a call's prompt tokens may be written to the cache (billed at the
    /// dearest prompt price); the others at most at [`Price::prompt_unwritten`]. All of
    /// them, except for a call asking only for the summary ([`Budget::answer_only`]).
    writable: u64,
}

impl Budget {
    /// A budget of `limit_usd` for a model priced `price`, nothing spent yet. A limit that is
    /// zero, negative or NaN refuses every call.
    pub fn new(limit_usd: f64, price: Price) -> Budget {
        Budget {
            limit_usd,
            spent_usd: 0.0,
            price,
            writable: u64::MAX,
        }
    }

    pub fn limit(&self) -> f64 {
        self.limit_usd
    }

    pub fn spent(&self) -> f64 {
        self.spent_usd
    }

    /// What is left of the limit (never below zero).
    pub fn remaining(&self) -> f64 {
        (self.limit_usd - self.spent_usd).max(0.0)
    }

    /// The price this budget bills at.
    pub fn price(&self) -> Price {
        self.price
    }

    /// The same budget with `usd` of its limit set aside (for a later call), to plan a call
    /// that must leave it untouched.
    pub fn reserving(&self, usd: f64) -> Budget {
        Budget {
            limit_usd: self.limit_usd - usd.max(0.0),
            ..self.clone()
        }
    }

    /// The budget a call with tools is planned in so that a last call asking only for the
    /// summary still fits after it, whatever it answers. `summary_prompt` bounds the prompt
    /// of the shortest summary request after this call apart from this call's answer; the
    /// summary sends that answer again, so each output token of this call is planned at the
    /// output price plus the dearest prompt price, and the summary's worst case
    /// (`summary_prompt` tokens in, `summary_tokens` out) is set aside. The reserve is
    /// therefore as small as it can be for the call's `max_tokens`, and kept whatever its
    /// share of the limit: a call that does not fit with it leaves room for the summary.
    ///
    /// The summary request caches nothing new (no later call would read it: the Anthropic
    /// provider sends it without a breakpoint on its messages), so only its first
    /// `frame_upper` tokens — tools and system prompt, up to their breakpoint — can be
    /// billed as cache writes; its messages, this call's answer among them, are billed at
    /// most at the input price ([`Budget::answer_only`]).
    pub fn keeping_summary(
        &self,
        summary_prompt: u64,
        frame_upper: u64,
        summary_tokens: u32,
    ) -> Budget {
        let summary = self.answer_only(frame_upper);
        let mut planned = self.reserving(summary.worst_case(summary_prompt, summary_tokens));
        planned.price.output += self.price.prompt_unwritten();
        planned
    }

    /// This budget for a call asking only for the summary, whose prompt tokens past its
    /// first `frame_upper` (an upper bound of the tools and system prompt) cannot be
    /// written to the cache: they are planned at [`Price::prompt_unwritten`].
    pub fn answer_only(&self, frame_upper: u64) -> Budget {
        Budget {
            writable: frame_upper,
            ..self.clone()
        }
    }

    /// The worst-case cost of the prompt of a call sending at most `prompt_tokens_upper`
    /// prompt tokens, in millionths of a dollar (prices are per million tokens).
    fn prompt_worst_micro(&self, prompt_tokens_upper: u64) -> f64 {
        let written = prompt_tokens_upper.min(self.writable);
        written as f64 * self.price.prompt_worst()
            + (prompt_tokens_upper - written) as f64 * self.price.prompt_unwritten()
    }

    /// The worst-case cost of a call sending at most `prompt_tokens_upper` prompt tokens and
    /// generating at most `max_tokens`.
    pub fn worst_case(&self, prompt_tokens_upper: u64, max_tokens: u32) -> f64 {
        (self.prompt_worst_micro(prompt_tokens_upper) + max_tokens as f64 * self.price.output)
            / MILLION
    }

    /// Whether a call costing at most `worst` keeps the spend within the limit, with the
    /// safety margin. False for NaN.
    fn fits(&self, worst: f64) -> bool {
        self.spent_usd + worst + safety_margin(self.limit_usd) <= self.limit_usd
    }

    /// Before a call: the largest `max_tokens` that keeps the worst case of this call within
    /// the limit, given an upper bound of the prompt tokens it will send
    /// (`prompt_tokens_upper`, all of it possibly billed at the dearest prompt price, but
    /// for a budget made by [`Budget::answer_only`]).
    ///
    /// Returns `Ok(wanted)` when the full `wanted` fits, `Ok(lower)` when only a lower value
    /// fits but it is still `>= min_useful`, else `Err(CostLimitReached)` whose `needed` is
    /// the worst case of the smallest useful call. `min_useful` is taken as at least 1 (a
    /// call with no output is no call) and at most `wanted`.
    pub fn plan_call(
        &self,
        prompt_tokens_upper: u64,
        wanted: u32,
        min_useful: u32,
    ) -> Result<u32, CostLimitReached> {
        if self.fits(self.worst_case(prompt_tokens_upper, wanted)) {
            return Ok(wanted);
        }
        let floor = min_useful.max(1).min(wanted);
        // The largest n with worst_case(n) fitting, solved in closed form, then corrected
        // downwards by the exact check (the division may be off by one either way).
        let per_output_token = self.price.output / MILLION;
        let room = self.limit_usd
            - safety_margin(self.limit_usd)
            - self.spent_usd
            - self.prompt_worst_micro(prompt_tokens_upper) / MILLION;
        let mut n: u32 = if per_output_token > 0.0 && room > 0.0 {
            // `as` saturates; NaN becomes 0.
            (room / per_output_token).floor().min(wanted as f64) as u32
        } else {
            0
        };
        while n > 0 && !self.fits(self.worst_case(prompt_tokens_upper, n)) {
            n -= 1;
        }
        if n >= floor && self.fits(self.worst_case(prompt_tokens_upper, n)) {
            Ok(n)
        } else {
            Err(CostLimitReached {
                spent: self.spent_usd,
                limit: self.limit_usd,
                needed: self.worst_case(prompt_tokens_upper, floor),
            })
        }
    }

    /// After a call: adds the call's exact cost from its usage; returns that cost.
    ///
    /// Not clamped: if a provider ever billed more than the planned worst case, the true
    /// spend is kept (an honest report), even above the limit.
    pub fn record(&mut self, usage: &Usage) -> f64 {
        let cost = self.price.cost(usage);
        self.spent_usd += cost;
        cost
    }
}

/// The next call could cross the cost limit, so it is not made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostLimitReached {
    /// USD spent so far.
    pub spent: f64,
    /// The limit in USD.
    pub limit: f64,
    /// The worst case in USD of the smallest useful next call.
    pub needed: f64,
}

impl fmt::Display for CostLimitReached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cost limit reached: {} spent of the {} limit, and the next model call could cost up to {}",
            format_usd(self.spent),
            format_usd(self.limit),
            format_usd(self.needed)
        )
    }
}

impl std::error::Error for CostLimitReached {}

/// Tokens added to each block's own bytes by [`token_upper_bound`]: the role and turn
/// markers and block delimiters a provider wraps around a piece of content.
pub const BLOCK_OVERHEAD_TOKENS: u64 = 16;

/// Tokens added once per request by [`request_token_upper_bound`]: the tool-use system
/// prompt a provider injects when tools are offered (Anthropic documents a few hundred
/// tokens) and the framing of the request.
pub const REQUEST_OVERHEAD_TOKENS: u64 = 1024;

/// An upper bound of the tokens of a piece of text: its UTF-8 byte count (a token always
/// covers at least one byte, so this never under-counts) plus [`BLOCK_OVERHEAD_TOKENS`].
pub fn token_upper_bound(text: &str) -> u64 {
    text.len() as u64 + BLOCK_OVERHEAD_TOKENS
}

/// An upper bound of the prompt tokens of a request: the system prompt, every tool
/// definition and every block of every message (tool calls and their inputs as compact
/// JSON), each with [`token_upper_bound`], plus [`REQUEST_OVERHEAD_TOKENS`].
pub fn request_token_upper_bound(request: &Request) -> u64 {
    frame_token_upper_bound(request) + messages_token_upper_bound(&request.messages)
}

/// An upper bound of the prompt tokens up to a request's first cache breakpoint: the
/// system prompt and the tool definitions, each with [`token_upper_bound`], plus
/// [`REQUEST_OVERHEAD_TOKENS`] (the tool-use preamble): [`request_token_upper_bound`]
/// without the messages.
pub fn frame_token_upper_bound(request: &Request) -> u64 {
    let mut total = REQUEST_OVERHEAD_TOKENS + token_upper_bound(&request.system);
    for tool in &request.tools {
        total += token_upper_bound(&tool.name)
            + token_upper_bound(&tool.description)
            + json_len(&tool.input_schema);
    }
    total
}

fn json_len(v: &serde_json::Value) -> u64 {
    serde_json::to_string(v).map_or(0, |s| s.len() as u64)
}

/// An upper bound of the prompt tokens of `messages` alone (their blocks, each with
/// [`token_upper_bound`]).
pub fn messages_token_upper_bound(messages: &[Message]) -> u64 {
    let mut total = 0;
    for message in messages {
        for block in &message.content {
            total += match block {
                Block::Text { text } => token_upper_bound(text),
                Block::ToolUse { id, name, input } => {
                    token_upper_bound(id) + name.len() as u64 + json_len(input)
                }
                Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } => token_upper_bound(tool_use_id) + content.len() as u64,
                // Images are billed by their pixels, not their bytes.
                Block::Image { image } => image.token_upper_bound() + BLOCK_OVERHEAD_TOKENS,
            };
        }
    }
    total
}

/// The prompt tokens the provider reported for earlier requests of a run, so that the
/// next request's bound counts exactly what the model has already seen and bounds only
/// what is new (issue 12).
///
/// A call's usage (`input + cache_write + cache_read`, OpenAI's `prompt_tokens`) is the
/// exact size of everything that request sent. A later request that starts with the same
/// model, system prompt, tools and messages is bounded by that count plus
/// [`token_upper_bound`] of each block added since. Where no earlier request is a prefix
/// of this one (the first call; a provider that reports no usage; a conversation whose
/// older messages were rewritten, e.g. elided) the bound falls back to the bytes of the
/// part that is not covered, down to the whole request ([`request_token_upper_bound`]).
/// Prefixes are recognised by a SHA-256 chain over the messages, never by position alone.
#[derive(Debug, Default, Clone)]
pub struct PromptLedger {
    known: Vec<Known>,
}

#[derive(Debug, Clone)]
struct Known {
    /// SHA-256 of model, system prompt and tools.
    frame: [u8; 32],
    /// Chained SHA-256 of the first `messages` messages.
    chain: [u8; 32],
    messages: usize,
    answer_only: bool,
    tokens: u64,
}

/// At most this many earlier requests are remembered (the newest; older ones are longer
/// prefixes' prefixes and rarely the best match).
const LEDGER_ENTRIES: usize = 64;

fn frame_hash(request: &Request) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(request.model.as_bytes());
    h.update([0]);
    h.update(request.system.as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(&request.tools).unwrap_or_default());
    h.finalize().into()
}

/// The chained hashes of every prefix of `messages`: element i covers messages[..=i].
fn chain_hashes(messages: &[Message]) -> Vec<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let mut out = Vec::with_capacity(messages.len());
    let mut prev = [0u8; 32];
    for m in messages {
        let mut h = Sha256::new();
        h.update(prev);
        h.update(serde_json::to_vec(m).unwrap_or_default());
        prev = h.finalize().into();
        out.push(prev);
    }
    out
}

impl PromptLedger {
    /// After a call: remembers the exact prompt size of `request` from `usage`. A usage
    /// without prompt tokens (a provider that reports none) teaches nothing.
    pub fn record(&mut self, request: &Request, usage: &Usage) {
        let tokens = usage.prompt_tokens();
        if tokens == 0 || request.messages.is_empty() {
            return;
        }
        let chain = chain_hashes(&request.messages);
        if self.known.len() == LEDGER_ENTRIES {
            self.known.remove(0);
        }
        self.known.push(Known {
            frame: frame_hash(request),
            chain: chain[chain.len() - 1],
            messages: request.messages.len(),
            answer_only: request.answer_only,
            tokens,
        });
    }

    /// An upper bound of the prompt tokens `request` will be billed for: the exact count
    /// of the longest earlier request it extends, plus the bound of every message after
    /// it; without one, [`request_token_upper_bound`]. Never below what a provider counts
    /// that counts the same messages the same way each time.
    pub fn upper_bound(&self, request: &Request) -> u64 {
        let full = request_token_upper_bound(request);
        if self.known.is_empty() || request.messages.is_empty() {
            return full;
        }
        let frame = frame_hash(request);
        let chain = chain_hashes(&request.messages);
        let best = self
            .known
            .iter()
            .filter(|k| {
                k.frame == frame
                    && k.messages <= request.messages.len()
                    && chain[k.messages - 1] == k.chain
            })
            .max_by_key(|k| k.messages);
        let Some(k) = best else { return full };
        // `tool_choice` may change the tool-use preamble a provider adds (a few hundred
        // tokens): allow the whole request overhead again when it differs.
        let choice = if k.answer_only == request.answer_only {
            0
        } else {
            REQUEST_OVERHEAD_TOKENS
        };
        k.tokens + choice + messages_token_upper_bound(&request.messages[k.messages..])
    }
}

/// A dollar amount as the status comments show it: `$0.0234` (four decimals) below $1,
/// `$2.00` (two decimals) from $1.
///
/// Rounding is half away from zero on the decimal value as written (12.345 → `$12.35`,
/// although the nearest f64 is a hair below 12.345): the amount is first written with ten
/// decimals, which drops the binary noise, then rounded. The four/two-decimal choice is made
/// on the rounded value, so 0.99999 shows as `$1.00`, not `$1.0000`.
pub fn format_usd(x: f64) -> String {
    if !x.is_finite() {
        return format!("${x}");
    }
    let sign = if x < 0.0 { "-" } else { "" };
    let ten = format!("{:.10}", x.abs());
    let Some((int, frac)) = ten.split_once('.') else {
        return format!("{sign}${ten}");
    };
    let (Ok(int), Ok(frac)) = (int.parse::<u128>(), frac.parse::<u128>()) else {
        return format!("{sign}${:.2}", x.abs());
    };
    let Some(units) = int
        .checked_mul(10u128.pow(10))
        .and_then(|u| u.checked_add(frac))
    else {
        return format!("{sign}${:.2}", x.abs());
    };
    let round = |decimals: u32| {
        let divisor = 10u128.pow(10 - decimals);
        (units + divisor / 2) / divisor
    };
    let (value, decimals) = match round(4) {
        v if v < 10_000 => (v, 4),
        _ => (round(2), 2),
    };
    let scale = 10u128.pow(decimals);
    let sign = if value == 0 { "" } else { sign };
    format!(
        "{sign}${}.{:0width$}",
        value / scale,
        value % scale,
        width = decimals as usize
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, Role, ToolSpec};

    /// A tokenizer as a provider may have one: each block costs between 1 token and its
    /// bound ([`token_upper_bound`]), chosen per block content (so the same block always
    /// counts the same), the frame (system, tools, preamble) likewise.
    struct Tokenizer {
        seed: u64,
    }

    impl Tokenizer {
        fn pick(&self, text: &str, max: u64) -> u64 {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (self.seed, text).hash(&mut h);
            // Mostly the worst case, sometimes far below it.
            match h.finish() % 4 {
                0 => max,
                1 => 1 + h.finish() % max,
                _ => max / 4 + 1,
            }
        }

        fn count(&self, request: &Request) -> u64 {
            let frame = REQUEST_OVERHEAD_TOKENS
                + token_upper_bound(&request.system)
                + request
                    .tools
                    .iter()
                    .map(|t| {
                        token_upper_bound(&t.name)
                            + token_upper_bound(&t.description)
                            + json_len(&t.input_schema)
                    })
                    .sum::<u64>();
            let mut total = self.pick(&format!("frame{}", request.answer_only), frame);
            for m in &request.messages {
                let bound = messages_token_upper_bound(std::slice::from_ref(m));
                total += self.pick(&serde_json::to_string(m).unwrap(), bound);
            }
            total
        }
    }

    /// An image counts by its pixels, the larger of the two providers' formulas, not by
    /// its bytes.
    #[test]
    fn an_image_counts_by_its_pixels() {
        let image =
            crate::image::Image::from_bytes(crate::image::samples::png(1000, 1000)).unwrap();
        let with = Message::user_with_images("go", &[image]);
        let without = messages_token_upper_bound(&[Message::user_text("go")]);
        assert_eq!(
            messages_token_upper_bound(&[with]) - without,
            1334 + BLOCK_OVERHEAD_TOKENS
        );
    }

    #[test]
    fn the_ledger_never_undercounts_under_adversarial_usage() {
        let tools = vec![ToolSpec {
            name: "feed_chars".into(),
            description: "Type into a shell.".into(),
            input_schema: serde_json::json!({"type": "object"}),
        }];
        for seed in 0..200u64 {
            let tok = Tokenizer { seed };
            let mut ledger = PromptLedger::default();
            let mut request = Request {
                model: "m".into(),
                system: "You work in a container.".into(),
                messages: vec![Message::user_text("go")],
                tools: tools.clone(),
                max_tokens: 100,
                temperature: None,
                answer_only: false,
            };
            for step in 0..12u64 {
                let truth = tok.count(&request);
                let bound = ledger.upper_bound(&request);
                assert!(
                    bound >= truth,
                    "seed {seed} step {step}: bound {bound} < {truth} tokens"
                );
                // Whatever split the provider reports (cache read, write, plain), or none.
                let r = seed.wrapping_mul(31).wrapping_add(step) % 5;
                let reported = match r {
                    0 => usage(truth, 5, 0, 0),
                    1 => usage(0, 5, truth, 0),
                    2 => usage(1, 5, truth / 2, truth - truth / 2 - 1),
                    3 => usage(0, 5, 0, truth),
                    _ => Usage::default(),
                };
                ledger.record(&request, &reported);
                // The next request: an answer and a result of any size, and now and then an
                // old result rewritten (elided) or the last call without tools.
                let id = format!("t{step}");
                request.messages.push(Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: id.clone(),
                        name: "feed_chars".into(),
                        input: serde_json::json!({"chars": "x".repeat((seed * 7 + step) as usize % 300)}),
                    }],
                });
                request.messages.push(Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: id,
                        content: "é".repeat(((seed * 13 + step * 101) % 3000) as usize),
                        is_error: false,
                    }],
                });
                if (seed + step) % 4 == 0 && request.messages.len() > 3 {
                    request.messages[2].content = vec![Block::ToolResult {
                        tool_use_id: "t0".into(),
                        content: format!("[elided at step {step}]"),
                        is_error: false,
                    }];
                }
                request.answer_only = (seed + step) % 6 == 5;
            }
        }
    }

    #[test]
    fn the_ledger_counts_what_was_seen_exactly_and_only_bounds_what_is_new() {
        let mut request = Request {
            model: "m".into(),
            system: "s".repeat(10_000),
            messages: vec![Message::user_text("go")],
            tools: vec![],
            max_tokens: 100,
            temperature: None,
            answer_only: false,
        };
        let mut ledger = PromptLedger::default();
        let first = ledger.upper_bound(&request);
        assert_eq!(first, request_token_upper_bound(&request));
        ledger.record(&request, &usage(0, 10, 2_600, 0));
        let before = request.clone();
        request.messages.push(Message {
            role: Role::Assistant,
            content: vec![Block::Text { text: "ok".into() }],
        });
        request.messages.push(Message::user_text("more"));
        let added = messages_token_upper_bound(&request.messages[1..]);
        assert_eq!(ledger.upper_bound(&request), 2_600 + added);
        // Another system prompt: nothing is known.
        let mut other = request.clone();
        other.system.push('!');
        assert_eq!(
            ledger.upper_bound(&other),
            request_token_upper_bound(&other)
        );
        // The first message rewritten: nothing is known either.
        let mut rewritten = request.clone();
        rewritten.messages[0] = Message::user_text("went");
        assert_eq!(
            ledger.upper_bound(&rewritten),
            request_token_upper_bound(&rewritten)
        );
        // Without tools allowed: room for another preamble.
        let mut last = before.clone();
        last.answer_only = true;
        assert_eq!(ledger.upper_bound(&last), 2_600 + REQUEST_OVERHEAD_TOKENS);
    }

    fn usage(input: u64, output: u64, cache_write: u64, cache_read: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_write_tokens: cache_write,
            cache_read_tokens: cache_read,
        }
    }

    fn p(input: f64, output: f64, cache_write: f64, cache_read: f64) -> Price {
        Price {
            input,
            output,
            cache_write,
            cache_read,
        }
    }

    fn sonnet() -> Price {
        Pricing::builtin()
            .price("claude-sonnet-4-20250514")
            .unwrap()
    }

    #[test]
    fn shipped_pricing_parses_and_has_every_listed_model_at_its_list_price() {
        let pricing = Pricing::builtin();
        let expected: &[(&[&str], Price)] = &[
            (
                &[
                    "claude-opus-4-1",
                    "claude-opus-4-1-20250805",
                    "claude-opus-4",
                    "claude-opus-4-20250514",
                ],
                p(15.0, 75.0, 18.75, 1.50),
            ),
            (
                &[
                    "claude-sonnet-4-5",
                    "claude-sonnet-4-5-20250929",
                    "claude-sonnet-4",
                    "claude-sonnet-4-20250514",
                    "claude-3-7-sonnet-20250219",
                    "claude-3-7-sonnet-latest",
                ],
                p(3.0, 15.0, 3.75, 0.30),
            ),
            (
                &["claude-haiku-4-5", "claude-haiku-4-5-20251001"],
                p(1.0, 5.0, 1.25, 0.10),
            ),
            (
                &["claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"],
                p(0.80, 4.0, 1.00, 0.08),
            ),
            (&["gpt-4.1"], p(2.0, 8.0, 2.0, 0.50)),
            (&["gpt-4.1-mini"], p(0.40, 1.60, 0.40, 0.10)),
            (&["gpt-4.1-nano"], p(0.10, 0.40, 0.10, 0.025)),
            (&["gpt-4o"], p(2.50, 10.0, 2.50, 1.25)),
            (&["gpt-4o-mini"], p(0.15, 0.60, 0.15, 0.075)),
            (&["o3"], p(2.0, 8.0, 2.0, 0.50)),
            (&["o4-mini"], p(1.10, 4.40, 1.10, 0.275)),
            (&["gpt-5"], p(1.25, 10.0, 1.25, 0.125)),
            (&["gpt-5-mini"], p(0.25, 2.0, 0.25, 0.025)),
        ];
        let mut count = 0;
        for (names, price) in expected {
            for name in *names {
                assert_eq!(pricing.price(name).unwrap(), *price, "{name}");
                count += 1;
            }
        }
        // Nothing shipped that is not on the list above.
        assert_eq!(pricing.models().count(), count);
        // The model of the example program file.
        let example = include_str!("../tests/data/python-kodx-program.yaml");
        assert!(example.contains("name: claude-sonnet-4-20250514"));
        assert_eq!(
            pricing.price("claude-sonnet-4-20250514").unwrap(),
            p(3.0, 15.0, 3.75, 0.30)
        );
        // Anthropic's cache prices follow their rule: 1.25x and 0.1x the input price.
        for (name, price) in pricing.models().filter(|(n, _)| n.starts_with("claude")) {
            assert!(
                (price.cache_write - 1.25 * price.input).abs() < 1e-12,
                "{name}"
            );
            assert!(
                (price.cache_read - 0.1 * price.input).abs() < 1e-12,
                "{name}"
            );
        }
    }

    #[test]
    fn exact_cost_counts_each_token_kind_once_at_its_own_price() {
        let u = usage(1200, 350, 8000, 24000);
        let cost = sonnet().cost(&u);
        // 0.0036 + 0.00525 + 0.03 + 0.0072
        assert!((cost - 0.04605).abs() < 1e-12, "{cost}");
        assert_eq!(format_usd(cost), "$0.0461");

        let o4 = Pricing::builtin().price("o4-mini").unwrap();
        let cost = o4.cost(&usage(1_000_000, 1_000_000, 1_000_000, 1_000_000));
        assert!(
            (cost - (1.10 + 4.40 + 1.10 + 0.275)).abs() < 1e-12,
            "{cost}"
        );
        assert_eq!(sonnet().cost(&Usage::default()), 0.0);
    }

    #[test]
    fn cache_writes_are_not_counted_twice() {
        let u = usage(1200, 350, 8000, 24000);
        let price = sonnet();
        let cost = price.cost(&u);
        // The wrong ways: cache writes billed as input and again as cache writes, the
        // whole prompt (cached tokens included) billed as input on top of the cache prices,
        // or the 1.25x write surcharge applied on top of the cache-write price.
        let double_write = cost + 8000.0 * price.input / MILLION;
        let prompt_as_input_too = cost + (8000.0 + 24000.0) * price.input / MILLION;
        let write_at_surcharge_twice = cost + 8000.0 * (price.cache_write - price.input) / MILLION;
        for wrong in [double_write, prompt_as_input_too, write_at_surcharge_twice] {
            assert!((wrong - cost).abs() > 1e-4, "{wrong} vs {cost}");
        }
        // The 8000 written tokens cost exactly 8000 x 3.75 per million, no more.
        let only_writes = price.cost(&usage(0, 0, 8000, 0));
        assert!((only_writes - 0.03).abs() < 1e-12);
    }

    #[test]
    fn unknown_model_is_refused_with_how_to_add_it() {
        let pricing = Pricing::builtin();
        // No fuzzy matching of dated names.
        for model in [
            "claude-sonnet-4-20990101",
            "claude-sonnet",
            "gpt-9",
            "Claude-Sonnet-4",
        ] {
            let err = pricing.price(model).unwrap_err();
            assert!(matches!(&err, CostError::NoPrice { model: m } if m == model));
            let msg = err.to_string();
            for needle in [
                model,
                "cost limit could not be kept",
                "input, output, cache_write, cache_read",
                "--pricing",
                "KODX_PRICING",
                "config/pricing.toml",
            ] {
                assert!(msg.contains(needle), "{needle:?} not in {msg}");
            }
        }
    }

    #[test]
    fn bad_pricing_files_are_refused_naming_the_source() {
        let cases = [
            (
                "[models.\"m\"]\ninput = 1\noutput = 1\ncache_write = 1\ncache_read = 1\ncolour = 2\n",
                "colour",
            ),
            ("[modles.\"m\"]\ninput = 1\n", "modles"),
            (
                "[models.\"m\"]\ninput = -1\noutput = 1\ncache_write = 1\ncache_read = 1\n",
                "negative",
            ),
            (
                "[models.\"m\"]\ninput = 1\noutput = nan\ncache_write = 1\ncache_read = 1\n",
                "finite",
            ),
            (
                "[models.\"m\"]\ninput = 1\noutput = inf\ncache_write = 1\ncache_read = 1\n",
                "finite",
            ),
            ("[models.\"m\"]\ninput = 1\noutput = 1\ncache_write = 1\n", "cache_read"),
            ("this is not toml at all {", ""),
            ("[models.\"m\"]\ninput = \"cheap\"\noutput = 1\ncache_write = 1\ncache_read = 1\n", ""),
        ];
        for (text, needle) in cases {
            let err = Pricing::from_toml(text, "/home/me/prices.toml").unwrap_err();
            assert!(
                matches!(&err, CostError::Invalid { source, .. } if source == "/home/me/prices.toml")
            );
            let msg = err.to_string();
            assert!(msg.contains("/home/me/prices.toml"), "{msg}");
            assert!(msg.contains(needle), "{needle:?} not in {msg}");
        }
    }

    #[test]
    fn user_file_entries_replace_and_add() {
        let user = Pricing::from_toml(
            "[models.\"claude-sonnet-4-20250514\"]\ninput = 1\noutput = 2\ncache_write = 3\ncache_read = 4\n\
             [models.\"qwen2.5-coder:32b\"]\ninput = 0\noutput = 0\ncache_write = 0\ncache_read = 0\n",
            "user.toml",
        )
        .unwrap();
        let merged = Pricing::builtin().merged(user);
        assert_eq!(
            merged.price("claude-sonnet-4-20250514").unwrap(),
            p(1.0, 2.0, 3.0, 4.0)
        );
        assert_eq!(
            merged.price("qwen2.5-coder:32b").unwrap(),
            p(0.0, 0.0, 0.0, 0.0)
        );
        assert_eq!(merged.price("gpt-4o").unwrap(), p(2.50, 10.0, 2.50, 1.25));
        // An empty file is a valid, empty table.
        assert_eq!(
            Pricing::from_toml("", "empty.toml")
                .unwrap()
                .models()
                .count(),
            0
        );
    }

    #[test]
    fn from_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prices.toml");
        let err = Pricing::from_file(&path).unwrap_err();
        assert!(err.to_string().contains(&path.display().to_string()));
        std::fs::write(
            &path,
            "[models.\"x\"]\ninput = 1\noutput = 1\ncache_write = 1\ncache_read = 1\n",
        )
        .unwrap();
        assert_eq!(
            Pricing::from_file(&path).unwrap().price("x").unwrap(),
            p(1.0, 1.0, 1.0, 1.0)
        );
    }

    #[test]
    fn plan_call_gives_wanted_when_it_fits() {
        // Worst case: 10_000 x 3.75e-6 + 20_000 x 15e-6 = 0.0375 + 0.3 = 0.3375.
        let budget = Budget::new(2.0, sonnet());
        assert_eq!(budget.plan_call(10_000, 20_000, 256), Ok(20_000));
        assert!((budget.worst_case(10_000, 20_000) - 0.3375).abs() < 1e-12);
        // Exactly at the limit is refused by the safety margin, a hair below is accepted.
        let exact = Budget::new(0.3375, sonnet());
        assert!(exact.plan_call(10_000, 20_000, 256).unwrap() < 20_000);
        let above = Budget::new(0.3375 + 1e-6, sonnet());
        assert_eq!(above.plan_call(10_000, 20_000, 256), Ok(20_000));
    }

    #[test]
    fn plan_call_lowers_max_tokens_when_only_part_fits() {
        // Prompt worst 0.0375; 0.0625 left for output = 4166.67 tokens at 15e-6.
        let budget = Budget::new(0.1, sonnet());
        let n = budget.plan_call(10_000, 20_000, 256).unwrap();
        assert_eq!(n, 4166);
        assert!(budget.worst_case(10_000, n) <= 0.1);
        assert!(budget.worst_case(10_000, n + 1) > 0.1 - safety_margin(0.1));
    }

    #[test]
    fn plan_call_refuses_when_not_even_the_smallest_useful_call_fits() {
        let budget = Budget::new(0.04, sonnet());
        // 0.0375 + 256 x 15e-6 = 0.04134 > 0.04.
        let err = budget.plan_call(10_000, 20_000, 256).unwrap_err();
        assert_eq!(err.spent, 0.0);
        assert_eq!(err.limit, 0.04);
        assert!((err.needed - 0.04134).abs() < 1e-12);
        assert_eq!(
            err.to_string(),
            "cost limit reached: $0.0000 spent of the $0.0400 limit, and the next model call \
             could cost up to $0.0413"
        );
        // The prompt alone does not fit.
        let err = Budget::new(0.01, sonnet())
            .plan_call(10_000, 20_000, 1)
            .unwrap_err();
        assert!(err.needed > 0.0375);
        // A zero, negative or NaN limit refuses everything.
        for limit in [0.0, -1.0, f64::NAN] {
            assert!(Budget::new(limit, sonnet()).plan_call(1, 1, 1).is_err());
        }
    }

    /// Simulates runs in which every call costs its whole planned worst case (every prompt
    /// token billed at the dearest prompt price, all `max_tokens` generated).
    fn run_worst_case(
        limit: f64,
        price: Price,
        first_prompt: u64,
        growth: u64,
        min_useful: u32,
    ) -> Budget {
        let mut budget = Budget::new(limit, price);
        let mut prompt = first_prompt;
        for _ in 0..10_000 {
            match budget.plan_call(prompt, 20_000, min_useful) {
                Ok(max_tokens) => {
                    assert!(max_tokens >= min_useful && max_tokens <= 20_000);
                    let worst = if price.cache_write >= price.input {
                        usage(0, max_tokens as u64, prompt, 0)
                    } else {
                        usage(prompt, max_tokens as u64, 0, 0)
                    };
                    let cost = budget.record(&worst);
                    assert!((cost - budget.worst_case(prompt, max_tokens)).abs() < 1e-12);
                    assert!(
                        budget.spent() <= limit,
                        "spent {} > limit {limit}",
                        budget.spent()
                    );
                    prompt += max_tokens as u64 + growth;
                }
                Err(reached) => {
                    assert!(reached.spent <= limit);
                    assert_eq!(reached.limit, limit);
                    assert!(reached.spent + reached.needed > limit - safety_margin(limit));
                    return budget;
                }
            }
        }
        panic!("the run never reached its cost limit");
    }

    /// What [`run_keeping_summary`] saw: each call's kind, and what was spent.
    struct SummaryRun {
        /// `true` for a call asking only for the summary.
        calls: Vec<bool>,
        spent: f64,
        /// The largest share of the limit one call's worst case took.
        largest_share: f64,
    }

    /// A run as the agent loop plans it, with every call billed at its worst case: calls
    /// with tools planned in [`Budget::keeping_summary`], and when one no longer fits, one
    /// last call asking only for the summary, planned in the whole budget. The summary's
    /// prompt is `skeleton` (the shortest request: old results elided) plus the last
    /// call's whole answer; the working prompt grows by each answer and `growth`. Calls
    /// with tools are billed as all written to the cache; the summary has its first
    /// [`FRAME`] tokens written and the rest billed at the input price (it has no
    /// breakpoint on its messages).
    fn run_keeping_summary(
        limit: f64,
        first_prompt: u64,
        skeleton: u64,
        growth: u64,
    ) -> SummaryRun {
        let price = sonnet();
        let mut budget = Budget::new(limit, price);
        let (mut prompt, mut last_answer) = (first_prompt, 0u64);
        let mut run = SummaryRun {
            calls: vec![],
            spent: 0.0,
            largest_share: 0.0,
        };
        let bill =
            |budget: &mut Budget, prompt: u64, out: u32, summary: bool, run: &mut SummaryRun| {
                let (worst, billed) = if summary {
                    let frame = FRAME.min(prompt);
                    let worst = budget.answer_only(FRAME).worst_case(prompt, out);
                    (worst, usage(prompt - frame, out as u64, frame, 0))
                } else {
                    (
                        budget.worst_case(prompt, out),
                        usage(0, out as u64, prompt, 0),
                    )
                };
                run.largest_share = run.largest_share.max(worst / limit);
                let cost = budget.record(&billed);
                assert!((cost - worst).abs() < 1e-12);
            };
        for _ in 0..1000 {
            let planning = budget.keeping_summary(skeleton + last_answer, FRAME, MIN_SUMMARY);
            let mut planned = planning.plan_call(prompt, 8192, 512);
            // The loop's first call, when it does not fit beside the reserve, is made in the
            // whole budget.
            if planned.is_err() && run.calls.is_empty() {
                planned = budget.plan_call(prompt, 8192, 512).or(planned);
            }
            match planned {
                Ok(n) => {
                    bill(&mut budget, prompt, n, false, &mut run);
                    run.calls.push(false);
                    last_answer = n as u64;
                    prompt += n as u64 + growth;
                }
                Err(_) => {
                    let summary_prompt = skeleton + last_answer;
                    let summary = budget.answer_only(FRAME);
                    if let Ok(n) = summary.plan_call(summary_prompt, MIN_SUMMARY, MIN_SUMMARY) {
                        bill(&mut budget, summary_prompt, n, true, &mut run);
                        run.calls.push(true);
                    }
                    break;
                }
            }
        }
        run.spent = budget.spent();
        assert!(run.spent <= limit, "spent {} of {limit}", run.spent);
        run
    }

    const MIN_SUMMARY: u32 = 256;
    /// The tokens of tools and system prompt, up to the summary request's only breakpoint.
    const FRAME: u64 = 2_000;

    #[test]
    fn calls_over_a_tenth_of_the_cap_still_end_with_a_summary_call() {
        // Sonnet, 8192 output tokens a call ($0.12 alone), prompts from 20k tokens.
        for limit in [0.25, 0.4, 0.6, 1.0, 2.0] {
            let run = run_keeping_summary(limit, 20_000, 6_000, 3_000);
            assert!(
                run.largest_share > 0.1,
                "${limit}: the calls are over 10 % of the cap"
            );
            assert_eq!(run.calls.last(), Some(&true), "${limit}: {:?}", run.calls);
            assert_eq!(run.calls.iter().filter(|s| **s).count(), 1);
            assert!(
                run.calls.len() >= 2,
                "${limit}: work was done: {:?}",
                run.calls
            );
        }
        // A cap that pays for a summary but not for a call with tools: the one call is the
        // summary.
        let tight = Budget::new(1.0, sonnet())
            .answer_only(FRAME)
            .worst_case(6_000, MIN_SUMMARY)
            + 0.01;
        let run = run_keeping_summary(tight, 20_000, 6_000, 3_000);
        assert_eq!(run.calls, vec![true]);
        // One that pays for a first call with tools but not beside the reserve: that call is
        // made (work first), and no summary is certain after it.
        let run = run_keeping_summary(0.09, 20_000, 6_000, 3_000);
        assert_eq!(run.calls.first(), Some(&false), "{:?}", run.calls);
        // A cap below one summary call: no call at all.
        let run = run_keeping_summary(0.01, 20_000, 6_000, 3_000);
        assert!(run.calls.is_empty() && run.spent == 0.0);
    }

    #[test]
    fn the_summary_reserve_grows_with_the_call_and_no_more() {
        let budget = Budget::new(1.0, sonnet());
        let planning = budget.keeping_summary(6_000, FRAME, MIN_SUMMARY);
        let n = planning.plan_call(20_000, 100_000, 512).unwrap();
        // The call and the summary after it (its prompt holding the call's whole answer,
        // billed past the frame at the input price) fit the limit together, to the token:
        // one more output token would not.
        let summary = budget.answer_only(FRAME);
        let together = |n: u32| {
            budget.worst_case(20_000, n) + summary.worst_case(6_000 + n as u64, MIN_SUMMARY)
        };
        // The summary's messages are planned at the input price, its frame at the write one.
        let expected = (FRAME as f64 * 3.75 + 4_000.0 * 3.0 + 256.0 * 15.0) / 1e6;
        assert!((summary.worst_case(6_000, MIN_SUMMARY) - expected).abs() < 1e-12);
        assert!(together(n) + safety_margin(1.0) <= 1.0);
        assert!(together(n + 2) > 1.0 - safety_margin(1.0));
    }

    #[test]
    fn worst_case_runs_never_spend_above_the_limit() {
        let pricing = Pricing::builtin();
        let mut limits = vec![0.001, 0.0116, 0.01, 0.05, 0.1, 0.3375, 1.0, 2.0, 5.0];
        // Amounts that are not exact in binary.
        limits.extend((1..40).map(|k| k as f64 * 0.0137 + 0.001));
        for model in [
            "claude-sonnet-4-20250514",
            "claude-opus-4-1",
            "o4-mini",
            "gpt-4.1-nano",
            "gpt-5-mini",
        ] {
            let price = pricing.price(model).unwrap();
            for &limit in &limits {
                for (first, growth) in [(10, 0), (300, 7), (2_000, 3_000), (40_000, 1_000)] {
                    let budget = run_worst_case(limit, price, first, growth, 256);
                    assert!(
                        budget.spent() <= limit,
                        "{model} {limit}: {}",
                        budget.spent()
                    );
                }
            }
        }
    }

    #[test]
    fn python_kodx_overspend_case_stays_within_a_tenth_of_a_cent() {
        // Python kodx spent $0.0116 against --cost-limit 0.001 with this model.
        let mut budget = Budget::new(0.001, sonnet());
        let mut prompt = 2_000;
        let mut calls = 0;
        let reached = loop {
            match budget.plan_call(prompt, 20_000, 16) {
                Ok(n) => {
                    budget.record(&usage(0, n as u64, prompt, 0));
                    prompt += n as u64 + 500;
                    calls += 1;
                }
                Err(reached) => break reached,
            }
        };
        // 2000 prompt tokens alone may cost 0.0075: no call is made at all.
        assert_eq!(calls, 0);
        assert!(budget.spent() <= 0.001);
        assert_eq!(reached.spent, budget.spent());
        // A small first prompt lets a few calls through, still within the limit.
        let budget = run_worst_case(0.001, sonnet(), 20, 50, 16);
        assert!(budget.spent() <= 0.001 && budget.spent() > 0.0);
    }

    #[test]
    fn record_keeps_the_true_spend_even_above_the_limit() {
        let mut budget = Budget::new(0.01, sonnet());
        let n = budget.plan_call(100, 20_000, 16).unwrap();
        // A provider billing far more than planned: reported as it is, not clamped.
        let cost = budget.record(&usage(0, n as u64 * 10, 100, 0));
        assert!(cost > 0.01);
        assert_eq!(budget.spent(), cost);
        assert!(budget.spent() > budget.limit());
        assert_eq!(budget.remaining(), 0.0);
        assert!(budget.plan_call(1, 20_000, 1).is_err());
    }

    #[test]
    fn remaining_tracks_spend() {
        let mut budget = Budget::new(1.0, sonnet());
        assert_eq!(budget.remaining(), 1.0);
        let cost = budget.record(&usage(1200, 350, 8000, 24000));
        assert!((budget.spent() - cost).abs() < 1e-15);
        assert!((budget.remaining() - (1.0 - 0.04605)).abs() < 1e-12);
    }

    #[test]
    fn token_bounds_never_under_count() {
        assert_eq!(token_upper_bound(""), BLOCK_OVERHEAD_TOKENS);
        assert_eq!(token_upper_bound("hello"), 5 + BLOCK_OVERHEAD_TOKENS);
        // Bytes, not characters: 'é' is 2 bytes, '🦀' 4.
        assert_eq!(token_upper_bound("é🦀"), 6 + BLOCK_OVERHEAD_TOKENS);

        let request = Request {
            model: "m".into(),
            system: "sys".into(),
            messages: vec![
                Message::user_text("hi"),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "t1".into(),
                        name: "shell".into(),
                        input: serde_json::json!({"cmd": "ls"}),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: "t1".into(),
                        content: "a b".into(),
                        is_error: false,
                    }],
                },
            ],
            tools: vec![ToolSpec {
                name: "shell".into(),
                description: "run".into(),
                input_schema: serde_json::json!({"type": "object"}),
            }],
            max_tokens: 10,
            temperature: None,
            answer_only: false,
        };
        let bytes = 3 + 2 + (2 + 5 + 12) + (2 + 3) + (5 + 3 + 17);
        let bound = request_token_upper_bound(&request);
        assert!(bound >= bytes + REQUEST_OVERHEAD_TOKENS);
        assert_eq!(
            bound,
            bytes + REQUEST_OVERHEAD_TOKENS + 6 * BLOCK_OVERHEAD_TOKENS
        );
    }

    #[test]
    fn format_usd_as_status_comments_show_it() {
        assert_eq!(format_usd(0.0234), "$0.0234");
        assert_eq!(format_usd(2.0), "$2.00");
        assert_eq!(format_usd(0.0), "$0.0000");
        assert_eq!(format_usd(12.345), "$12.35");
        assert_eq!(format_usd(0.00005), "$0.0001");
        assert_eq!(format_usd(0.000049), "$0.0000");
        assert_eq!(format_usd(0.0116), "$0.0116");
        assert_eq!(format_usd(0.001), "$0.0010");
        assert_eq!(format_usd(0.99999), "$1.00");
        assert_eq!(format_usd(0.9999), "$0.9999");
        assert_eq!(format_usd(1.0), "$1.00");
        assert_eq!(format_usd(1.005), "$1.01");
        assert_eq!(format_usd(1234.5), "$1234.50");
        assert_eq!(format_usd(-0.5), "-$0.5000");
        assert_eq!(format_usd(-0.00001), "$0.0000");
        assert_eq!(format_usd(1e30), "$1000000000000000019884624838656.00");
    }
}
