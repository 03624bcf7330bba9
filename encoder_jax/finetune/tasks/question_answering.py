"""Extractive question answering (SQuAD v1.1 / v2.0): reading, windows, decoding, metrics.

See ``encoder_jax.finetune.qa`` for the command and the recipe (google-research/bert's
``run_squad.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import string
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.core import fields as fields_lib
from encoder_jax.data import sources
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import task as task_lib


@dataclasses.dataclass
class Example:
  id: str
  question: str
  context: str
  answers: list[tuple[str, int]]  # (text, character start in context); [] = no answer.


# ---------------------------------------------------------------------------- reading


def _squad_json(spec: str, path: str) -> list[Example]:
  text = ''.join(sources.text_lines(path, f'config.data: {spec!r}'))
  try:
    doc = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{spec!r}: {path} is not JSON ({e})') from None
  if not isinstance(doc, dict) or 'data' not in doc:
    raise ValueError(f"{spec!r}: expected SQuAD JSON (an object with 'data')")
  out = []
  for article in doc['data']:
    for para in article['paragraphs']:
      for qa in para['qas']:
        answers = [] if qa.get('is_impossible') else [
            (a['text'], int(a['answer_start'])) for a in qa['answers']]
        out.append(Example(str(qa['id']), qa['question'], para['context'], answers))
  return out


def _squad_tfds(spec: str, tfds_data_dir: str) -> list[Example]:
  out = []
  for ex in sources.tfds_split(spec, tfds_data_dir).examples():
    texts = [t.decode('utf-8') for t in ex['answers']['text']]
    starts = [int(s) for s in ex['answers']['answer_start']]
    out.append(Example(ex['id'].decode('utf-8'), ex['question'].decode('utf-8'),
                       ex['context'].decode('utf-8'),
                       [] if ex.get('is_impossible', False) else list(zip(texts, starts))))
  return out


def read(spec: str, tfds_data_dir: str = '') -> list[Example]:
  """Questions of a SQuAD split: ``tfds:squad/v1.1:train`` or ``json:PATH``; an answer not
  at its ``answer_start`` is moved to the nearest occurrence of its text, else dropped
  (counted, and warned)."""
  kind, rest = sources.split_spec(spec, ('json', 'tfds'), 'config.data',
                                  "'tfds:NAME:SPLIT' or 'json:PATH'")
  out = _squad_json(spec, rest) if kind == 'json' else _squad_tfds(spec, tfds_data_dir)
  if not out:
    raise ValueError(f'{spec!r} has no questions')
  moved = dropped = 0
  for e in out:  # An answer not at its start: the nearest occurrence, else dropped; counted.
    kept = []
    for text, start in e.answers:
      if e.context[start:start + len(text)] != text:
        found = [m.start() for m in re.finditer(re.escape(text), e.context)]
        if not found:
          dropped += 1
          continue
        start = min(found, key=lambda k: abs(k - start))
        moved += 1
      kept.append((text, start))
    if e.answers and not kept:
      kept = [(e.answers[0][0], -1)]  # Scored by its text; never a training label.
    e.answers = kept
  if moved or dropped:
    print(f'Warning: {spec}: {moved} answers were not at their answer_start and were moved '
          f'to the nearest occurrence of their text; {dropped} do not occur in their context '
          'and were dropped', flush=True)
  return out


# ---------------------------------------------------------------------------- windows


@dataclasses.dataclass
class Windows:
  """Encoded rows and, per row, what maps its pieces back to the context."""
  arrays: dict[str, np.ndarray]
  example: np.ndarray  # Row -> index of its question.
  positions: list[np.ndarray]  # Row -> row positions of its context pieces.
  spans: list[np.ndarray]  # Row -> [n, 2] character spans of those pieces.
  cls_position: np.ndarray  # Row -> position of the classifier token.
  answers_outside: int = 0  # Training windows labelled 'no answer' (answer elsewhere).
  answers_lost: int = 0  # Training questions whose answer no window holds whole.


def windows(examples: Sequence[Example], tok, max_len: int = 384, doc_stride: int = 128,
            max_query_length: int = 64, train: bool = False) -> Windows:
  ids_rows, seg_rows, marks, out_example = [], [], [], []
  spans, starts = [], []
  held = collections.Counter()
  added = tok.num_added(True)
  for i, e in enumerate(examples):
    q = tok.encode(e.question)[:max_query_length]
    ctx, offsets = tok.encode_with_offsets(e.context)
    room = max_len - len(q) - added
    if room < 1:
      raise ValueError(f'config.data.max_len={max_len} leaves no room for the context after '
                       f'a {len(q)}-piece question (max_query_length={max_query_length})')
    answer = None
    if train and e.answers and e.answers[0][1] >= 0:
      text, start = e.answers[0]
      end = start + len(text)
      inside = [k for k, (a, b) in enumerate(offsets) if a < end and b > start and b > a]
      if inside:
        answer = (inside[0], inside[-1])
    begin = 0
    while True:
      length = min(room, len(ctx) - begin)
      piece_ids = ctx[begin:begin + length]
      row, segs = tok.frame(q, piece_ids)
      mark, _ = tok.frame([-1] * len(q), [-2 - k for k in range(length)])
      ids_rows.append(row)
      seg_rows.append(segs)
      marks.append(mark)
      out_example.append(i)
      spans.append(np.asarray(offsets[begin:begin + length], np.int64).reshape(-1, 2))
      label = None
      if answer is not None and begin <= answer[0] and answer[1] < begin + length:
        label = (answer[0] - begin, answer[1] - begin)
        held[i] += 1
      starts.append(label)
      if begin + length >= len(ctx):
        break
      begin += min(room, doc_stride)
  ids, seg, mask = tok.pad(ids_rows, seg_rows, max_len)
  marked, _, _ = tok.pad(marks, None, max_len)
  positions, cls_position = [], np.zeros(len(ids_rows), np.int32)
  start_pos = np.zeros(len(ids_rows), np.int32)
  end_pos = np.zeros(len(ids_rows), np.int32)
  for r in range(len(ids_rows)):
    where = {int(-2 - m): p for p, m in enumerate(marked[r]) if m <= -2}
    positions.append(np.asarray([where[k] for k in range(len(where))], np.int64))
    cls_position[r] = int(np.flatnonzero(ids[r] == tok.cls_id)[0])
    label = starts[r]
    if label is None:
      start_pos[r] = end_pos[r] = cls_position[r]
    else:
      start_pos[r], end_pos[r] = positions[r][label[0]], positions[r][label[1]]
  arrays = {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask,
            'start_positions': start_pos, 'end_positions': end_pos}
  lost = sum(1 for i, e in enumerate(examples) if train and e.answers and not held[i])
  outside = sum(1 for r in range(len(ids_rows)) if train and starts[r] is None
                and examples[out_example[r]].answers)
  return Windows(arrays, np.asarray(out_example, np.int64), positions, spans, cls_position,
                 answers_outside=outside, answers_lost=lost)


# ---------------------------------------------------------------------------- decoding


def decode(examples: Sequence[Example], w: Windows, logits_NxLx2: np.ndarray,
           n_best: int = 20, max_answer_length: int = 30, version_2: bool = False,
           null_score_threshold: float = 0.0) -> tuple[dict[str, str], dict[str, float]]:
  """(question id -> answer text, question id -> null score minus best span score)."""
  best: dict[int, tuple[float, str]] = {}
  null: dict[int, float] = {}
  for r in range(len(w.example)):
    i = int(w.example[r])
    start, end = logits_NxLx2[r, :, 0], logits_NxLx2[r, :, 1]
    cls = int(w.cls_position[r])
    null[i] = min(null.get(i, np.inf), float(start[cls] + end[cls]))
    pos = w.positions[r]
    if not len(pos):
      continue
    s_logits, e_logits = start[pos], end[pos]
    top_s = np.argsort(-s_logits, kind='stable')[:n_best]
    top_e = np.argsort(-e_logits, kind='stable')[:n_best]
    for a in top_s:
      for b in top_e:
        if b < a or b - a + 1 > max_answer_length:
          continue
        score = float(s_logits[a] + e_logits[b])
        if i not in best or score > best[i][0]:
          text = examples[i].context[w.spans[r][a][0]:w.spans[r][b][1]]
          best[i] = (score, text)
  predictions, diffs = {}, {}
  for i, e in enumerate(examples):
    score, text = best.get(i, (-np.inf, ''))
    diffs[e.id] = null.get(i, -np.inf) - score
    predictions[e.id] = '' if version_2 and diffs[e.id] > null_score_threshold else text
  return predictions, diffs


# ---------------------------------------------------------------------------- metrics


def normalize_answer(s: str) -> str:
  """The official SQuAD normalisation: lower case, no punctuation, no articles, single
  spaces."""
  s = s.lower()
  s = ''.join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r'\b(a|an|the)\b', ' ', s)
  return ' '.join(s.split())


def exact(gold: str, pred: str) -> float:
  return float(normalize_answer(gold) == normalize_answer(pred))


def f1(gold: str, pred: str) -> float:
  g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
  if not g or not p:  # A no-answer: 1 only when both are empty.
    return float(g == p)
  common = collections.Counter(g) & collections.Counter(p)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def squad_metrics(examples: Sequence[Example], predictions: dict[str, str]) -> dict[str, float]:
  """Exact match and F1 (percent) as the official v2.0 script computes them (v1.1 is its
  HasAns part), the best over each question's gold answers; HasAns / NoAns splits."""
  scores = {'exact': [], 'f1': []}
  has, no = [], []
  for e in examples:
    golds = [t for t, _ in e.answers if normalize_answer(t)] or ['']
    pred = predictions.get(e.id, '')
    em, f = max(exact(g, pred) for g in golds), max(f1(g, pred) for g in golds)
    scores['exact'].append(em)
    scores['f1'].append(f)
    (has if e.answers else no).append((em, f))
  out = {'exact': 100 * float(np.mean(scores['exact'])), 'f1': 100 * float(np.mean(scores['f1'])),
         'total': len(examples)}
  for name, group in (('HasAns', has), ('NoAns', no)):
    if group:
      out[f'{name}_exact'] = 100 * float(np.mean([g[0] for g in group]))
      out[f'{name}_f1'] = 100 * float(np.mean([g[1] for g in group]))
      out[f'{name}_total'] = len(group)
  return out


# ---------------------------------------------------------------------------- the task

FIELDS = (
    fields_lib.Field('doc_stride', 128, fields_lib.integer(1),
                     'Question answering: pieces between the starts of a context\'s windows.'),
    fields_lib.Field('max_query_length', 64, fields_lib.integer(1),
                     'Question answering: pieces of the question kept (its start).'),
    fields_lib.Field('n_best', 20, fields_lib.integer(1),
                     'Question answering: start and end logits tried per window.'),
    fields_lib.Field('max_answer_length', 30, fields_lib.integer(1),
                     'Question answering: the longest answer span, in pieces.'),
    fields_lib.Field('version_2', False, fields_lib.boolean(),
                     'Question answering: SQuAD v2, answer "" when the null score wins.'),
    fields_lib.Field('null_score_threshold', 0.0, fields_lib.number(-1e6, 1e6),
                     'Question answering v2: answer "" when null minus best span exceeds it.'),
)


def prepare(config, tokenizer, max_len: int, workdir=None, log=print) -> data_lib.Prepared:
  """SQuAD questions in windows: the training windows labelled with their answer span, the
  eval windows with what maps them back to the contexts (for decoding)."""
  s, d = config.task_settings, config.data
  train_ex = read(d.train, d.tfds_data_dir)
  train_w = windows(train_ex, tokenizer, max_len, s.doc_stride, s.max_query_length, train=True)
  if train_w.answers_lost:
    log(f'Warning: {train_w.answers_lost} of {len(train_ex)} training questions have an '
        'answer no window holds whole (trained as no-answer there); raise max_len or '
        'doc_stride overlap')
  log(f'QA: {len(train_ex)} training questions in {len(train_w.example)} windows of {max_len} '
      f'pieces (stride {s.doc_stride}); {train_w.answers_outside} windows hold no answer')
  out = data_lib.Prepared(train=train_w.arrays, num_outputs=2, context={'workdir': workdir})
  if d.eval:
    eval_ex = read(d.eval, d.tfds_data_dir)
    eval_w = windows(eval_ex, tokenizer, max_len, s.doc_stride, s.max_query_length)
    out.evals, out.context['eval'] = eval_w.arrays, (eval_ex, eval_w)
  out.report.update(train_questions=len(train_ex), train_windows=len(train_w.example),
                    train_answers_lost=train_w.answers_lost)
  return out


def head(model_config, config, prepared: data_lib.Prepared):
  """Start and end logits on every final state."""
  del prepared
  return heads.Classifier(model_config, 2, config.dropout_rate, per_token=True)


def span_loss(logits_BxLx2, batch):
  """Question answering: the mean of the start and end cross-entropies (BERT's run_squad),
  each a softmax over the row's tokens (padding excluded), over real rows."""
  mask = batch['input_mask'] > 0
  w = batch['weights']
  logits = jnp.where(mask[..., None], logits_BxLx2.astype(jnp.float32), -1e9)
  logp = jax.nn.log_softmax(logits, axis=1)  # Over positions.
  losses, correct = [], []
  for i, key in enumerate(('start_positions', 'end_positions')):
    target = batch[key]
    losses.append(-jnp.take_along_axis(logp[..., i], target[:, None], axis=1)[:, 0])
    correct.append((jnp.argmax(logits[..., i], axis=1) == target).astype(jnp.float32))
  denom = jnp.maximum(w.sum(), 1.0)
  loss = ((losses[0] + losses[1]) / 2 * w).sum() / denom
  accuracy = ((correct[0] * correct[1]) * w).sum() / denom
  return loss, {'loss': loss, 'accuracy': accuracy, 'examples': w.sum()}


def setup(model, network, max_len: int, config) -> task_lib.Task:
  del config
  return task_lib.Task(model, network, max_len, span_loss, task_lib.identity)


def score(config, prepared: data_lib.Prepared, split: str, arrays, logits) -> dict:
  """Decoded answers (written to ``<workdir>/predictions.json``) and their EM and F1."""
  del arrays
  s = config.task_settings
  examples, w = prepared.context[split]
  predictions, _ = decode(examples, w, logits, s.n_best, s.max_answer_length, s.version_2,
                          s.null_score_threshold)
  workdir = prepared.context.get('workdir')
  if workdir:
    with open(os.path.join(workdir, 'predictions.json'), 'w', encoding='utf-8') as f:
      json.dump(predictions, f, ensure_ascii=False, indent=1)
  return squad_metrics(examples, predictions)
