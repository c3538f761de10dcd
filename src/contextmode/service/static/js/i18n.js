// UI labels in Chinese and English. The language is picked from navigator.language
// unless the user chose one with the toggle (kept in localStorage).

// Chinese names of what the server sends as identifiers (intents, jobs, pin keys, the
// detector's reason), so the Chinese page has no English labels.
const ZH_INTENTS = { detail: "展开", simplify: "简化", example: "举例", summary: "总结", pronoun: "指代" };
const ZH_JOBS = { memory: "记忆整理（情绪、约束、摘要）", summary: "摘要", constraints: "约束", emotion: "情绪", index: "索引" };
const ZH_PIN_KEYS = {
  budget: "预算", spice: "辣度", diet: "饮食", name: "名字", age: "年龄", location: "住址", hometown: "家乡",
  job: "职业", workplace: "工作单位", like: "喜欢", dislike: "不喜欢", allergy: "过敏", avoid: "避免",
  family: "家人", favorite: "最爱", fact: "事实",
};

/** The detector's reason ("model p=0.42, cue: …", "follow-up intent example") in Chinese. */
function zhReason(reason) {
  return reason
    .replace(/^model p=/, "模型概率 ")
    .replace(/, cue: /, "，线索：")
    .replace(/^follow-up intent (\w+)/, (_, intent) => `追问意图：${ZH_INTENTS[intent] ?? intent}`)
    .replace(/^no earlier turns$/, "没有更早的对话");
}

const STRINGS = {
  zh: {
    subtitle: "上下文检查器",
    session: "会话",
    newSession: "新会话",
    noSessions: "（还没有会话）",
    mode: "模式",
    modeDefault: "默认（服务的设置）",
    skipToComposer: "跳到输入框",
    busy: "正在等待服务器…",
    modeContextual: "上下文模式",
    modeDecoupled: "解耦模式",
    apiKey: "API 密钥",
    langToggle: "English",
    chat: "对话",
    inspector: "模型看到了什么",
    placeholder: "输入消息，Enter 发送，Shift+Enter 换行",
    attach: "图片",
    preview: "预览上下文",
    send: "发送",
    sending: "生成中…",
    emptyChat: "发一条消息开始。右侧会显示模型收到的每一层内容。",
    emptyInspector: "发送消息或点击“预览上下文”，这里会显示模型收到的每一层及其 token。",
    imagesAttached: (n) => `${n} 张图片`,
    removeImage: "移除图片",
    sourceTurn: (n) => `第 ${n} 轮发送时`,
    sourceSending: "本轮发送时",
    sourcePast: (n) => `第 ${n} 轮：模型当时收到的内容（已保存）`,
    viewTurn: "模型收到了什么",
    viewTurnLabel: (n) => `模型收到了什么（第 ${n} 轮）`,
    diffTitle: "你输入的 → 模型收到的",
    diffSame: "模型收到的就是你输入的原话。",
    diffHelp: "删除线是你输入而模型没收到的，下划线是模型收到而你没输入的。",
    diffIns: "模型收到、你没输入",
    diffDel: "你输入、模型没收到",
    templateTitle: (intent) => `追问模板（${intent}）`,
    templateNote: "按上一条回答展开的追问模板，不是改写：模型收到的是模板加上一条回答。",
    messagesReceived: (n, format) => `模型收到的 ${n} 条消息（${format}）`,
    sourcePreview: "草稿预览（未发送）",
    windowCaption: (used, budget, reserve) => `输入 ${used} / ${budget} tokens，回复预留 ${reserve}`,
    exact: "精确计数",
    estimated: "估算",
    strategy: "策略",
    prepareMs: (ms) => `准备 ${ms} ms`,
    usagePrompt: (n) => `输入 ${n} tokens`,
    usageCacheable: (n, pct) => `可缓存前缀 ${n}（${pct}%）`,
    usageCached: (n) => `上游计为缓存 ${n}`,
    usageMoney: (usd, total, family) => `本轮 $${usd} · 本会话 $${total}（${family} 价格）`,
    modelCalls: (n) => `这一轮期间的 ${n} 次模型调用`,
    callRow: (c) => `${c.step}（${c.priority === "reply" ? "回复" : "后台"}${c.session ? " " + c.session : ""}）：等待 ${Math.round(c.wait_ms)} ms，用时 ${Math.round(c.duration_ms)} ms，${c.prompt_tokens ?? "?"} → ${c.completion_tokens ?? "?"} tokens，${c.outcome}`,
    replyStopped: (why) => `回复被提前停止：${why}`,
    layers: "各层 token（已用 / 分配）",
    items: (n) => `${n} 项`,
    truncated: "已截断",
    emptyLayer: "空：预留了预算，这一轮没有内容",
    keyMomentWhy: (e, th) => `情绪强度 ${e} > ${th}（强烈情绪）`,
    recalledTitle: "为什么召回这些轮次",
    recalledHelp: "较早的轮次因与消息相关（召回）或情绪强烈（关键时刻）而回到上下文。",
    recallScore: (ranker, score) => `${ranker} 得分 ${score}`,
    rankerFused: "BM25+向量融合",
    recallMatched: (terms) => `匹配词：${terms}`,
    recallRelated: "经相关词找到（无直接匹配词）",
    recallNeighbour: (ref) => `${ref}的前一条（上下文）`,
    recallAnswer: (ref) => `${ref}的下一条（对其提问的回答）`,
    keyMomentIntensity: (e) => `情绪强度 ${e}`,
    droppedInLayer: (seqs) => `丢弃：${seqs}`,
    rewrite: "问题改写",
    original: "原问题",
    standalone: "独立问题（发给模型）",
    hint: "改写提示（已验证；模型收到的是原话，改写仅作提示）",
    notRewritten: "未改写：原问题即发给模型的问题",
    detection: (d) =>
      `需要上下文：${d.needs_context ? "是" : "否"}` +
      (d.intent ? ` · 意图 ${ZH_INTENTS[d.intent] ?? d.intent}` : "") +
      ` · 分数 ${Number(d.score).toFixed(2)}` +
      (d.reason ? ` · ${zhReason(d.reason)}` : ""),
    rewriteSource: (s) => `改写来源：${s}`,
    constraints: "固定约束",
    noConstraints: "还没有约束。",
    storage: "存储",
    storageMeasure: "统计占用",
    storageHelp: "这个会话按记录类型各占多少字节（与 contextmode stats 相同）。",
    storageTotal: (total, exchanges, perExchange, raw) =>
      `共 ${total.toLocaleString()} 字节，${exchanges} 轮，每轮 ${perExchange == null ? "—" : perExchange.toLocaleString()} 字节；双方原话共 ${raw.toLocaleString()} 字节`,
    storageKind: "记录类型",
    storageBytes: "字节",
    storageShare: "占比",
    storagePerExchange: "每轮",
    fromTurn: (n) => `来自第 ${n} 轮`,
    turnRef: (n, role) => (role === "user" ? `第 ${n} 轮` : `第 ${n} 轮的${role === "tool" ? "工具结果" : "回答"}`),
    pinsThen: (n) => `第 ${n} 轮时的约束（模型当时收到的）`,
    pinsNow: "现在的约束",
    timeline: "会话时间线",
    legendCovered: "已被摘要覆盖",
    legendDropped: "被窗口丢弃",
    legendPinned: "约束来源",
    legendCurrent: "本轮消息",
    legendInContext: "在上下文中",
    messagesSent: (n, format) => `将发送的 ${n} 条消息（${format}）`,
    dropped: "窗口丢弃的轮次",
    noneDropped: "无",
    summary: "摘要",
    noSummary: "还没有摘要（轮次达到阈值后在后台生成）。",
    summaryCovers: (n, v, tokens) => `覆盖第 1–${n} 轮 · 版本 ${v} · ${tokens} tokens`,
    jobs: "后台任务",
    pending: "进行中",
    noJobs: "暂无后台任务。",
    jobLine: (ok, failed) => `成功 ${ok} · 失败 ${failed}`,
    keyTitle: "API 密钥",
    keyHelp: "服务开启了认证。输入租户的 API 密钥，它只保存在本浏览器（localStorage）。",
    keySave: "保存",
    keyCancel: "取消",
    keyForget: "清除",
    partial: "（回答未完成）",
    piiMasked: (n) => `🔒 已遮蔽 ${n} 项个人信息（保存前）`,
    interrupted: "（回答中断：上面的部分回答已保存）",
    notice: "（系统通知：未配置模型，这不是回答，也不会记入记忆）",
    error: "错误",
    turnMeta: (m) =>
      [m.ttft != null ? `首字 ${m.ttft} ms` : null, m.tokens != null ? `输入 ${m.tokens} tokens` : null,
        m.jobs?.length ? `后台：${m.jobs.map((j) => ZH_JOBS[j] ?? j).join("、")}` : null].filter(Boolean).join(" · "),
    turn: (n, role) => `第 ${n} 轮 · ${({ user: "用户", tool: "工具结果" })[role] ?? "助手"}`,
    jobName: (name) => ZH_JOBS[name] ?? name,
    pinKey: (key) => {
      const [head, ...rest] = key.split(":");
      return [ZH_PIN_KEYS[head] ?? head, ...rest].join("：");
    },
    kind: {
      sessions: "会话记录", turns: "对话轮次", traces: "留存的上下文", trace_texts: "上下文引用的文本",
      trace_turns: "留存上下文的轮号", trace_ages: "留存上下文的时间", trace_texts_turns: "引用文本的轮号",
      recall_postings: "召回索引", recall_index: "召回索引统计", recall_df: "召回词频",
      emotion_scores: "情绪分数", job_stats: "后台任务统计", idempotency: "幂等记录",
    },
    layer: {
      system: "系统指令", constraints: "约束", summary: "摘要", key_moments: "关键时刻", recall: "召回",
      recent: "近期对话", current: "当前消息", format: "格式要求",
    },
  },
  en: {
    subtitle: "context inspector",
    jobName: (name) => (name === "memory" ? "memory (emotion, constraints, summary)" : name),
    pinKey: (key) => key.split(":").join(": "),
    session: "Session",
    newSession: "New session",
    noSessions: "(no sessions yet)",
    mode: "Mode",
    modeDefault: "default (the service's)",
    skipToComposer: "Skip to the message box",
    busy: "Waiting for the server…",
    modeContextual: "contextual",
    modeDecoupled: "decoupled",
    apiKey: "API key",
    langToggle: "中文",
    chat: "Chat",
    inspector: "What the model sees",
    placeholder: "Type a message. Enter sends, Shift+Enter for a new line",
    attach: "Images",
    preview: "Preview context",
    send: "Send",
    sending: "Answering…",
    emptyChat: "Send a message to start. The right pane shows every layer the model receives.",
    emptyInspector: "Send a message or press “Preview context” to see each layer the model receives, with its tokens.",
    imagesAttached: (n) => `${n} image${n === 1 ? "" : "s"}`,
    removeImage: "Remove image",
    sourceTurn: (n) => `As sent with turn ${n}`,
    sourceSending: "As sent with this turn",
    sourcePast: (n) => `Turn ${n}: what the model received (kept)`,
    viewTurn: "What the model received",
    viewTurnLabel: (n) => `What the model received (turn ${n})`,
    diffTitle: "What you typed → what the model received",
    diffSame: "The model received your words exactly as typed.",
    diffHelp: "Struck through: typed but not received. Underlined: received but not typed.",
    diffIns: "received, not typed",
    diffDel: "typed, not received",
    templateTitle: (intent) => `Follow-up template (${intent})`,
    templateNote: "A follow-up template over the last answer, not a rewrite: the model got the template with the last answer.",
    messagesReceived: (n, format) => `The ${n} messages the model received (${format})`,
    sourcePreview: "Preview of the draft (not sent)",
    windowCaption: (used, budget, reserve) => `Input ${used} / ${budget} tokens, ${reserve} reserved for the reply`,
    exact: "exact count",
    estimated: "estimate",
    strategy: "strategy",
    prepareMs: (ms) => `prepared in ${ms} ms`,
    usagePrompt: (n) => `${n} input tokens`,
    usageCacheable: (n, pct) => `cacheable prefix ${n} (${pct}%)`,
    usageCached: (n) => `billed as cached ${n}`,
    usageMoney: (usd, total, family) => `this turn $${usd} · session $${total} (${family} prices)`,
    modelCalls: (n) => `${n} model call${n === 1 ? "" : "s"} while this turn ran`,
    callRow: (c) => `${c.step} (${c.priority}${c.session ? " " + c.session : ""}): waited ${Math.round(c.wait_ms)} ms, ran ${Math.round(c.duration_ms)} ms, ${c.prompt_tokens ?? "?"} → ${c.completion_tokens ?? "?"} tokens, ${c.outcome}`,
    replyStopped: (why) => `The reply was stopped early: ${why}`,
    layers: "Tokens per layer (used / allocated)",
    items: (n) => `${n} item${n === 1 ? "" : "s"}`,
    truncated: "truncated",
    emptyLayer: "empty: budget set aside, nothing to put in this turn",
    keyMomentWhy: (e, th) => `emotion ${e} > ${th} (strongly emotional)`,
    recalledTitle: "Why these turns were recalled",
    recalledHelp: "Older turns come back when they are relevant to the message (recall) or strongly emotional (key moments).",
    recallScore: (ranker, score) => `${ranker} score ${score}`,
    rankerFused: "BM25+dense fused",
    recallMatched: (terms) => `matched: ${terms}`,
    recallRelated: "found through related terms (no direct match)",
    recallNeighbour: (ref) => `the message before ${ref} (its context)`,
    recallAnswer: (ref) => `the message after ${ref} (the answer to its question)`,
    keyMomentIntensity: (e) => `emotion ${e}`,
    droppedInLayer: (seqs) => `dropped: ${seqs}`,
    rewrite: "Question rewrite",
    original: "Original",
    standalone: "Standalone (sent to the model)",
    hint: "Rewrite hint (verified; the model gets the original words, this only as a hint)",
    notRewritten: "Not rewritten: the model got the question as asked",
    detection: (d) =>
      `needs context: ${d.needs_context ? "yes" : "no"}` +
      (d.intent ? ` · intent ${d.intent}` : "") +
      ` · score ${Number(d.score).toFixed(2)}` +
      (d.reason ? ` · ${d.reason.replace(/^model p=/, "model probability ")}` : ""),
    rewriteSource: (s) => `rewritten by: ${s}`,
    constraints: "Pinned constraints",
    noConstraints: "No constraints yet.",
    storage: "Storage",
    storageMeasure: "Measure",
    storageHelp: "The bytes this session keeps, by kind of record (as contextmode stats prints them).",
    storageTotal: (total, exchanges, perExchange, raw) =>
      `${total.toLocaleString()} bytes, ${exchanges} exchanges, ${perExchange == null ? "—" : perExchange.toLocaleString()} bytes per exchange; both roles' own words: ${raw.toLocaleString()} bytes`,
    storageKind: "kind of record",
    storageBytes: "bytes",
    storageShare: "share",
    storagePerExchange: "per exchange",
    fromTurn: (n) => `from turn ${n}`,
    turnRef: (n, role) => (role === "user" ? `turn ${n}` : `turn ${n}'s ${role === "tool" ? "tool result" : "answer"}`),
    pinsThen: (n) => `Pins at turn ${n} (what the model got then)`,
    pinsNow: "Pins now",
    timeline: "Session timeline",
    legendCovered: "covered by the summary",
    legendDropped: "dropped by the window",
    legendPinned: "constraint source",
    legendCurrent: "this turn",
    legendInContext: "in the context",
    messagesSent: (n, format) => `The ${n} messages it would send (${format})`,
    dropped: "Turns the window dropped",
    noneDropped: "none",
    summary: "Summary",
    noSummary: "No summary yet (made in the background once enough turns pile up).",
    summaryCovers: (n, v, tokens) => `covers turns 1–${n} · version ${v} · ${tokens} tokens`,
    jobs: "Background jobs",
    pending: "pending",
    noJobs: "No background jobs yet.",
    jobLine: (ok, failed) => `ok ${ok} · failed ${failed}`,
    keyTitle: "API key",
    keyHelp: "This service requires authentication. Enter your tenant's API key; it is kept in this browser only (localStorage).",
    keySave: "Save",
    keyCancel: "Cancel",
    keyForget: "Forget",
    partial: "(answer incomplete)",
    piiMasked: (n) => `🔒 ${n} personal value${n === 1 ? "" : "s"} masked before storing`,
    interrupted: "(interrupted: the partial answer above was kept)",
    notice: "(engine notice: no model configured; not an answer, never remembered)",
    error: "Error",
    turnMeta: (m) =>
      [m.ttft != null ? `first token ${m.ttft} ms` : null, m.tokens != null ? `${m.tokens} input tokens` : null,
        m.jobs?.length ? `jobs: ${m.jobs.join(", ")}` : null].filter(Boolean).join(" · "),
    turn: (n, role) => `turn ${n} · ${role}`,
    kind: {
      sessions: "session row", turns: "turns", traces: "kept contexts", trace_texts: "texts kept contexts refer to",
      trace_turns: "kept contexts' turn numbers", trace_ages: "kept contexts' times", trace_texts_turns: "referred texts' turns",
      recall_postings: "recall index", recall_index: "recall index statistics", recall_df: "recall term counts",
      emotion_scores: "emotion scores", job_stats: "background job stats", idempotency: "idempotency records",
    },
    layer: {
      system: "System", constraints: "Constraints", summary: "Summary", key_moments: "Key moments", recall: "Recall",
      recent: "Recent turns", current: "Current message", format: "Format",
    },
  },
};

const STORAGE_KEY = "contextmode.lang";

function initialLang() {
  const saved = localStorage.getItem(STORAGE_KEY);
  if (saved && saved in STRINGS) return saved;
  return (navigator.language || "en").toLowerCase().startsWith("zh") ? "zh" : "en";
}

let lang = initialLang();

export function currentLang() {
  return lang;
}

export function setLang(next) {
  lang = next in STRINGS ? next : "en";
  localStorage.setItem(STORAGE_KEY, lang);
  applyStatic();
}

/** The label `key` in the current language; functions are called with `args`. */
export function t(key, ...args) {
  const value = STRINGS[lang][key] ?? STRINGS.en[key] ?? key;
  return typeof value === "function" ? value(...args) : value;
}

/** A kind of stored record in words (the API's name when we do not know it). */
export function recordKind(kind) {
  return STRINGS[lang].kind[kind] ?? kind;
}

/** A layer's label: ours when we know the layer, else the title the server sent. */
export function layerLabel(name, title) {
  return STRINGS[lang].layer[name] ?? title ?? name;
}

/** Fill every element marked data-i18n / data-i18n-placeholder / data-i18n-title. */
export function applyStatic(root = document) {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  for (const node of root.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
  for (const node of root.querySelectorAll("[data-i18n-placeholder]")) node.placeholder = t(node.dataset.i18nPlaceholder);
  for (const node of root.querySelectorAll("[data-i18n-title]")) node.title = t(node.dataset.i18nTitle);
}
