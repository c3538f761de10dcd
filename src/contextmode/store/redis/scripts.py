"""Lua scripts of the Redis store: each runs atomically inside Redis.

Keys of one session (``P`` = namespace + ``tenant/session_id``):
``{ns}s:P`` hash of heads and derived records, ``{ns}t:P`` hash seq → turn JSON
(written once), ``{ns}e:P`` sorted set of emotion scores (member = seq padded to
12 digits, so ties order by seq), ``{ns}j:P`` hash of job counters.
Kept traces: ``{ns}tr:P`` hash turn → packed trace (`store.trace_pack`; JSON when written
before), ``{ns}trn:P`` sorted set of turn numbers, ``{ns}tra:P`` the same members by creation
time (age limit), ``{ns}trx:P`` hash key → packed text the traces refer to, ``{ns}trxl:P``
those keys by the last turn referring to them (retention).
Recall index (`store.postings`, `_redis_postings`): ``{ns}rp:P`` hash ``block:term`` →
packed postings, ``{ns}ri:P`` hash of ``indexed_seq``, ``docs``, ``total_len`` and
``df:term`` (turns containing the term), written by APPEND with the turns.
Indexes: ``{ns}ix:tenant`` (session id by updated_at), ``{ns}idle``
(``tenant/session_id`` by updated_at), ``{ns}u:tenant/user`` (a user's session
ids by updated_at) and ``{ns}users:tenant`` (user ids by last activity).
Deletion records: ``{ns}del:ID`` hashes, ``{ns}deletions`` (ids), ``{ns}del:seq``
and ``{ns}del:open:tenant/scope/target`` (the unfinished record of a forget).
Idempotency records: ``{ns}idem:tenant:digest`` strings, listed per session in
the set ``{ns}idk:P`` (ERASE deletes the listed ones naming the session). Times are microsecond strings and are
never turned into Lua numbers for storage (Lua would print them rounded).
"""

from __future__ import annotations

from ..postings import BLOCK, POSTING


def _write_postings(postings: str, stats: str, row: str, indexed_seq: str, info: str) -> str:
    """Lua appending the rows described by ``ARGV[row]`` (``block term-bytes postings``
    triples, space-separated), whose terms are ``ARGV[row + 1]`` and packed postings
    ``ARGV[row + 2]`` (each concatenated in row order), to the ``postings`` hash and counting
    them in ``stats`` (``df:term``), then setting ``indexed_seq`` and adding docs
    ``ARGV[info]`` and length ``ARGV[info + 1]``. Four commands whatever the number of rows
    (each a read and a write of many fields, in chunks that `unpack` can take), not three per
    row: an append's index write is a few commands, and its arguments three strings."""
    return f"""
  local function mget(key, names)
    local out = {{}}
    for i = 1, #names, 1000 do
      local got = redis.call('HMGET', key, unpack(names, i, math.min(i + 999, #names)))
      for j = 1, #got do out[#out + 1] = got[j] end
    end
    return out
  end
  local function mset(key, names, values)
    for i = 1, #names, 1000 do
      local flat = {{}}
      for j = i, math.min(i + 999, #names) do
        flat[#flat + 1] = names[j]
        flat[#flat + 1] = values[j]
      end
      redis.call('HSET', key, unpack(flat))
    end
  end
  local terms, data = ARGV[{row} + 1], ARGV[{row} + 2]
  local fields, parts, names, counts, at = {{}}, {{}}, {{}}, {{}}, {{}}
  local tp, dp = 1, 1
  for b, l, c in string.gmatch(ARGV[{row}], '(%d+) (%d+) (%d+)') do
    local term = string.sub(terms, tp, tp + tonumber(l) - 1)
    local size = tonumber(c) * {POSTING.itemsize}
    fields[#fields + 1] = b .. ':' .. term
    parts[#parts + 1] = string.sub(data, dp, dp + size - 1)
    tp, dp = tp + tonumber(l), dp + size
    local name = 'df:' .. term
    if not at[name] then
      names[#names + 1] = name
      counts[#names] = 0
      at[name] = #names
    end
    counts[at[name]] = counts[at[name]] + tonumber(c)
  end
  local old = mget({postings}, fields)
  for i = 1, #fields do parts[i] = (old[i] or '') .. parts[i] end
  mset({postings}, fields, parts)
  local nt = #names
  names[nt + 1], names[nt + 2] = 'docs', 'total_len'
  local got = mget({stats}, names)
  for i = 1, nt do counts[i] = string.format('%d', tonumber(got[i] or '0') + counts[i]) end
  counts[nt + 1] = tonumber(got[nt + 1] or '0') + tonumber(ARGV[{info}])
  counts[nt + 2] = string.format('%.17g', tonumber(got[nt + 2] or '0') + tonumber(ARGV[{info} + 1]))
  names[nt + 3], counts[nt + 3] = 'indexed_seq', {indexed_seq}
  mset({stats}, names, counts)
"""

__all__ = [
    "APPEND",
    "BACKFILL",
    "COMMIT_CONSTRAINTS",
    "COMMIT_SUMMARY",
    "ERASE",
    "ERASE_BEFORE",
    "FINISH_DELETION",
    "INDEX_HEAD",
    "LIST_KEY",
    "LOAD",
    "OPEN_DELETION",
    "POSTINGS",
    "RECORD_JOB",
    "RELEASE_LOCK",
    "SET_EMOTIONS",
    "TRACE_PUT",
]

# KEYS: sess, turns, emo, tenant index, idle index, users index, recall postings, recall stats
# ARGV: expected ('' = none), now, session id, idle member, answer index (0 = none), n,
#       user id ('' = none), user index prefix, then per turn: json, emotion ('' = none), content,
#       then the recall index: the last_seq its postings assume ('' = none computed), the
#       SHA-1 of that turn's JSON ('' = not checked), new indexed_seq, docs, length, then the
#       rows: their ``block term-bytes postings`` triples, their terms, their packed postings
# Returns {1, last, 1 if the index was written else 0} (appended), {0, last} (compare-and-set
# lost), {2, last} (another user's), {3, last} (the postings assumed another last_seq, last
# turn or index state: nothing written, redo).
# The index is written when it is current (indexed_seq = last) or the session is new; a
# session written before the index existed is left to the catch-up (BACKFILL).
APPEND = """
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '0')
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= last then return {0, last} end
local owner = redis.call('HGET', KEYS[1], 'user_id')
if ARGV[7] ~= '' and owner and owner ~= ARGV[7] then return {2, last} end
local n = tonumber(ARGV[6])
if n == 0 then return {1, last} end
local x = 8 + n * 3
local ix = redis.call('HGET', KEYS[8], 'indexed_seq')
local index = (ix and tonumber(ix) == last) or (not ix and last == 0)
if index and (ARGV[x + 1] == '' or tonumber(ARGV[x + 1]) ~= last or (ARGV[x + 2] ~= ''
    and redis.sha1hex(redis.call('HGET', KEYS[2], last) or '') ~= ARGV[x + 2])) then
  return {3, last}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'created_at', ARGV[2], 'summary_version', 0,
             'summary_covers_seq', 0, 'constraints_version', 0, 'emotions_version', 0,
             'constraints', '[]', 'last_answer_seq', 0)
end
local scored = 0
if not owner and ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'user_id', ARGV[7])
  owner = ARGV[7]
end
for i = 1, n do
  local base = 8 + (i - 1) * 3
  local seq = last + i
  redis.call('HSET', KEYS[2], seq, ARGV[base + 1])
  if ARGV[base + 2] ~= '' then
    redis.call('ZADD', KEYS[3], ARGV[base + 2], string.format('%012d', seq))
    scored = 1
  end
end
redis.call('HSET', KEYS[1], 'last_seq', last + n, 'updated_at', ARGV[2])
local answer = tonumber(ARGV[5])
if answer > 0 then
  redis.call('HSET', KEYS[1], 'last_answer', ARGV[8 + (answer - 1) * 3 + 3],
             'last_answer_seq', last + answer)
end
if scored == 1 then redis.call('HINCRBY', KEYS[1], 'emotions_version', 1) end
if index then""" + _write_postings("KEYS[7]", "KEYS[8]", "x + 6", "last + n", "x + 4") + """end
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[4])
if owner then
  redis.call('ZADD', ARGV[8] .. owner, ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[6], ARGV[2], owner)
end
return {1, last, index and 1 or 0}
"""

# KEYS: sess, turns, emo; ARGV: recent, max_uncovered, key_moments, threshold
# Returns {heads, tail json, tail scores, moment seqs, moment json, moment scores} or {}.
LOAD = """
local h = redis.call('HMGET', KEYS[1], 'last_seq', 'summary_covers_seq', 'created_at',
  'updated_at', 'last_answer', 'summary_text', 'summary_tokens', 'summary_version',
  'summary_created_at', 'constraints', 'constraints_version')
if not h[1] then return {} end
local last = tonumber(h[1])
local count = math.min(math.max(last - tonumber(h[2]), tonumber(ARGV[1])),
                       math.max(tonumber(ARGV[2]), 0))
local first = math.max(1, last - count + 1)
local function fetch(seqs)
  local docs, scores = {}, {}
  for start = 1, #seqs, 500 do
    local part, padded = {}, {}
    for i = start, math.min(start + 499, #seqs) do
      part[#part + 1] = seqs[i]
      padded[#padded + 1] = string.format('%012d', seqs[i])
    end
    local d = redis.call('HMGET', KEYS[2], unpack(part))
    local s = redis.call('ZMSCORE', KEYS[3], unpack(padded))
    for i = 1, #part do
      docs[#docs + 1] = d[i]
      scores[#scores + 1] = s[i] or ''
    end
  end
  return docs, scores
end
local seqs = {}
for s = first, last do seqs[#seqs + 1] = s end
local tail, tail_scores = fetch(seqs)
local moments = {}
local k = tonumber(ARGV[3])
if k > 0 then
  -- The tail holds at most `count` scored turns, so k + count candidates always suffice.
  local cands = redis.call('ZREVRANGEBYSCORE', KEYS[3], '+inf', ARGV[4], 'LIMIT', 0, k + count)
  for _, member in ipairs(cands) do
    local seq = tonumber(member)
    if seq < first and #moments < k then moments[#moments + 1] = seq end
  end
  table.sort(moments)
end
local mdocs, mscores = fetch(moments)
return {h, tail, tail_scores, moments, mdocs, mscores}
"""

# KEYS: sess; ARGV: expected version, text, covers, tokens, created_at
COMMIT_SUMMARY = """
local v = redis.call('HMGET', KEYS[1], 'summary_version', 'summary_covers_seq', 'last_seq')
if not v[3] then return 0 end
local covers = tonumber(ARGV[3])
if tonumber(v[1]) ~= tonumber(ARGV[1]) then return 0 end
if covers <= tonumber(v[2]) or covers > tonumber(v[3]) then return 0 end
redis.call('HSET', KEYS[1], 'summary_text', ARGV[2], 'summary_covers_seq', ARGV[3],
           'summary_tokens', ARGV[4], 'summary_created_at', ARGV[5],
           'summary_version', tonumber(v[1]) + 1)
return 1
"""

# KEYS: sess; ARGV: expected version, constraints json
COMMIT_CONSTRAINTS = """
local v = redis.call('HGET', KEYS[1], 'constraints_version')
if not v or tonumber(v) ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'constraints', ARGV[2], 'constraints_version', tonumber(v) + 1)
return 1
"""

# KEYS: sess, emo; ARGV: seq, score, seq, score...
SET_EMOTIONS = """
local last = redis.call('HGET', KEYS[1], 'last_seq')
if not last then return 0 end
last = tonumber(last)
local changed = 0
for i = 1, #ARGV, 2 do
  local seq = tonumber(ARGV[i])
  if seq >= 1 and seq <= last then
    local member = string.format('%012d', seq)
    local old = redis.call('ZSCORE', KEYS[2], member)
    if not old or tonumber(old) ~= tonumber(ARGV[i + 1]) then
      redis.call('ZADD', KEYS[2], ARGV[i + 1], member)
      changed = 1
    end
  end
end
if changed == 1 then redis.call('HINCRBY', KEYS[1], 'emotions_version', 1) end
return changed
"""

# KEYS: sess, jobs; ARGV: job, ok (1/0), error, now
RECORD_JOB = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local job = ARGV[1]
redis.call('HINCRBY', KEYS[2], 'ok:' .. job, tonumber(ARGV[2]))
local rejected = tonumber(ARGV[5] or '0')
redis.call('HINCRBY', KEYS[2], 'failed:' .. job, 1 - tonumber(ARGV[2]) - rejected)
if rejected > 0 then redis.call('HINCRBY', KEYS[2], 'rejected:' .. job, rejected) end
if ARGV[2] == '1' then
  redis.call('HDEL', KEYS[2], 'error:' .. job)
else
  redis.call('HSET', KEYS[2], 'error:' .. job, ARGV[3])
end
redis.call('HSET', KEYS[2], 'run:' .. job, ARGV[4])
return 1
"""

# KEYS: sess, tenant index, idle index, users index, then one key per registered kind
# ARGV: session id, idle member, cutoff ('' = unconditionally), user index prefix,
#       deletion record key ('' = none), then per key "kind|field prefix" (the prefix, if
#       any, counts only the hash fields starting with it; "kind|*" marks a set listing key
#       names: each listed key whose JSON names this session id is deleted and counted)
# Returns {kind, count, kind, count, ...}; an idle check that fails returns {}.
ERASE = """
if ARGV[3] ~= '' then
  local updated = redis.call('HGET', KEYS[1], 'updated_at')
  if not updated or tonumber(updated) >= tonumber(ARGV[3]) then
    if not updated then redis.call('ZREM', KEYS[3], ARGV[2]) end
    return {}
  end
end
local h = redis.call('HMGET', KEYS[1], 'summary_version', 'constraints', 'user_id')
local out = {'sessions', redis.call('EXISTS', KEYS[1]),
             'summaries', (h[1] and tonumber(h[1]) > 0) and 1 or 0,
             'pins', h[2] and #cjson.decode(h[2]) or 0}
for i = 5, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  local sep = string.find(ARGV[i + 1], '|', 1, true)
  local name, fields = string.sub(ARGV[i + 1], 1, sep - 1), string.sub(ARGV[i + 1], sep + 1)
  local n = 0
  if string.sub(fields, 1, 1) == '*' then
    for _, listed in ipairs(redis.call('SMEMBERS', KEYS[i])) do
      local raw = redis.call('GET', listed)
      if raw and cjson.decode(raw)['session_id'] == ARGV[1] then n = n + redis.call('DEL', listed) end
    end
  elseif kind == 'hash' and fields ~= '' then
    for _, field in ipairs(redis.call('HKEYS', KEYS[i])) do
      if string.sub(field, 1, #fields) == fields then n = n + 1 end
    end
  elseif kind == 'hash' then n = redis.call('HLEN', KEYS[i])
  elseif kind == 'zset' then n = redis.call('ZCARD', KEYS[i])
  elseif kind == 'set' then n = redis.call('SCARD', KEYS[i])
  elseif kind == 'list' then n = redis.call('LLEN', KEYS[i])
  elseif kind ~= 'none' then n = 1 end
  redis.call('DEL', KEYS[i])
  out[#out + 1] = name
  out[#out + 1] = n
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
if h[3] then
  local mine = ARGV[4] .. h[3]
  redis.call('ZREM', mine, ARGV[1])
  if redis.call('ZCARD', mine) == 0 then redis.call('ZREM', KEYS[4], h[3]) end
end
if ARGV[5] ~= '' then
  for i = 1, #out, 2 do redis.call('HINCRBY', ARGV[5], 'c:' .. out[i], out[i + 1]) end
end
return out
"""

# KEYS: sess, turns, emo; ARGV: erase turns with seq < this, deletion record key ('' = none)
# Returns {turns erased, emotion scores erased}.
ERASE_BEFORE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local from = tonumber(redis.call('HGET', KEYS[1], 'pruned_before') or '1')
local upto = math.min(tonumber(ARGV[1]), tonumber(redis.call('HGET', KEYS[1], 'last_seq')) + 1)
local turns, scores = 0, 0
for seq = from, upto - 1 do
  turns = turns + redis.call('HDEL', KEYS[2], seq)
  scores = scores + redis.call('ZREM', KEYS[3], string.format('%012d', seq))
end
if upto > from then redis.call('HSET', KEYS[1], 'pruned_before', upto) end
if ARGV[2] ~= '' then
  redis.call('HINCRBY', ARGV[2], 'c:turns', turns)
  redis.call('HINCRBY', ARGV[2], 'c:emotion_scores', scores)
end
return {turns, scores}
"""

# KEYS: id counter, open-record key, deletions index
# ARGV: record key prefix, tenant, scope, target, actor, now
OPEN_DELETION = """
local open = redis.call('GET', KEYS[2])
if open then return tonumber(open) end
local id = redis.call('INCR', KEYS[1])
redis.call('HSET', ARGV[1] .. id, 'tenant', ARGV[2], 'scope', ARGV[3], 'target', ARGV[4],
           'actor', ARGV[5], 'started_at', ARGV[6])
redis.call('SET', KEYS[2], id)
redis.call('ZADD', KEYS[3], id, id)
return id
"""

# KEYS: record, open-record key; ARGV: id, now, then kind, count pairs
FINISH_DELETION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1]) end
redis.call('HSETNX', KEYS[1], 'finished_at', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""

# KEYS: lock; ARGV: token
# KEYS: a set listing key names; ARGV: a key name, ms the set must live at least
# (its expiry only grows: a fresh set has none, PTTL -1). Works on any Redis version.
LIST_KEY = """
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""

RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: sess, traces hash, turn numbers zset, creation times zset, kept texts hash, their last turns zset
# ARGV: turn, packed trace, keep (0 = no count limit), created micros, cutoff ('' = no age limit),
#       slack (TEXT_TURN_SLACK), then key, packed text pairs (the texts the trace refers to)
TRACE_PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local turn = tonumber(ARGV[1])
local slack = tonumber(ARGV[6])
for i = 7, #ARGV, 2 do
  redis.call('HSETNX', KEYS[5], ARGV[i], ARGV[i + 1])
  local last = redis.call('ZSCORE', KEYS[6], ARGV[i])
  if not last or tonumber(last) <= turn - slack then redis.call('ZADD', KEYS[6], turn, ARGV[i]) end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
local gone = {}
if tonumber(ARGV[3]) > 0 then
  local newest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  local upto = tonumber(newest[2]) - tonumber(ARGV[3])
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', upto)) do gone[#gone + 1] = t end
end
if ARGV[5] ~= '' then
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[5])) do gone[#gone + 1] = t end
end
for _, t in ipairs(gone) do
  redis.call('HDEL', KEYS[2], t)
  redis.call('ZREM', KEYS[3], t)
  redis.call('ZREM', KEYS[4], t)
end
if #gone > 0 then
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local below = '+inf'
  if #oldest > 0 then below = '(' .. (tonumber(oldest[2]) - slack) end
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', below)) do
    redis.call('HDEL', KEYS[5], k)
    redis.call('ZREM', KEYS[6], k)
  end
end
return 1
"""

# KEYS: sess, turns, index stats; ARGV: -
# Returns {last_seq, the last turn's JSON (false = none), indexed_seq (false = no index)}.
INDEX_HEAD = """
local last = redis.call('HGET', KEYS[1], 'last_seq') or '0'
local doc = false
if last ~= '0' then doc = redis.call('HGET', KEYS[2], last) end
return {tonumber(last), doc, redis.call('HGET', KEYS[3], 'indexed_seq')}
"""

# A Lua function both scripts below define: a term's rows from block ``first`` to ``top``,
# appended to ``out`` as term, the first block found, the rows joined (nothing if none).
_READ_TERM = """
local function read_term(out, term, first, top)
  local parts, lowest = {}, false
  for start = first, top, 500 do
    local fields = {}
    for b = start, math.min(start + 499, top) do fields[#fields + 1] = b .. ':' .. term end
    local got = redis.call('HMGET', KEYS[1], unpack(fields))
    for j = 1, #fields do
      if got[j] then
        if not lowest then lowest = start + j - 1 end
        parts[#parts + 1] = got[j]
      end
    end
  end
  if lowest then
    out[#out + 1] = term
    out[#out + 1] = lowest
    out[#out + 1] = table.concat(parts)
  end
end
"""

# KEYS: postings, index stats; ARGV: first block, then terms
# Returns {term, block, packed, ...}: per term that has postings from the first block up to
# the block of indexed_seq, one row, the block of its first posting and those blocks' packed
# postings joined in block order (one reply item per term, not per block: the client parses
# a few items instead of hundreds).
POSTINGS = _READ_TERM + f"""
local ix = tonumber(redis.call('HGET', KEYS[2], 'indexed_seq') or '0')
local first, top = tonumber(ARGV[1]), math.floor(ix / {BLOCK})
local out = {{}}
for i = 2, #ARGV do read_term(out, ARGV[i], first, top) end
return out
"""

# KEYS: postings, index stats
# ARGV: cap, most, then per term: term, first block, 1 if capped else 0 (capped ones read:
#       the first `most` found in at most cap turns)
# Returns per capped term found: term, -1, its frequency; per term with rows read (not a
# capped one found in more than cap turns): term, its first block read, the rows joined.
QUERY_POSTINGS = _READ_TERM + f"""
local ix = tonumber(redis.call('HGET', KEYS[2], 'indexed_seq') or '0')
local cap, most, top = tonumber(ARGV[1]), tonumber(ARGV[2]), math.floor(ix / {BLOCK})
local out = {{}}
for i = 3, #ARGV, 3 do
  local term, read = ARGV[i], true
  if ARGV[i + 2] == '1' then
    local df = tonumber(redis.call('HGET', KEYS[2], 'df:' .. term) or '0')
    if df > 0 then
      out[#out + 1] = term
      out[#out + 1] = -1
      out[#out + 1] = df
    end
    read = df <= cap and most > 0
    if read then most = most - 1 end
  end
  if read then read_term(out, term, tonumber(ARGV[i + 1]), top) end
end
return out
"""

# KEYS: sess, postings, index stats
# ARGV: indexed_seq the caller read ('' = no index yet), then the rows as for APPEND:
#       new indexed_seq, docs, length, the rows' triples, terms and packed postings
# Returns 1 (written), 0 (the index moved meanwhile: nothing written).
BACKFILL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ix = redis.call('HGET', KEYS[3], 'indexed_seq')
if (ix or '') ~= ARGV[1] then return 0 end
""" + _write_postings("KEYS[2]", "KEYS[3]", "5", "ARGV[2]", "3") + """return 1
"""
