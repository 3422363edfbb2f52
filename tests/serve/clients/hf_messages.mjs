// Run by the Cli.Store.HuggingFaceDirectoryAndMessages test: "fromhf" was
// created from a Hugging Face directory with two MESSAGE lines.
import assert from 'node:assert/strict';

const base = process.env.LOOM_URL;
const post = async (path, body) => {
  const r = await fetch(`${base}${path}`, { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
};
const show = await post('/api/show', { model: 'fromhf' });
assert.deepEqual(show.messages, [{ role: 'user', content: 'Hello' }, { role: 'assistant', content: 'Hi there' }]);
assert.equal(show.details.family, 'gpt2');
const chat = await post('/api/chat', { model: 'fromhf', stream: false, messages: [{ role: 'user', content: 'And?' }] });
assert.ok(chat.done && chat.eval_count >= 1 && chat.eval_count <= 3);
// The MESSAGE turns come before the request's: the prompt holds all three.
const alone = await post('/api/chat', { model: 'tiny', stream: false, messages: [{ role: 'user', content: 'And?' }] });
assert.ok(chat.prompt_eval_count > alone.prompt_eval_count, `${chat.prompt_eval_count} vs ${alone.prompt_eval_count}`);
console.log(`hf_messages: the HF model answers; its messages come first (${chat.prompt_eval_count} prompt tokens)`);
