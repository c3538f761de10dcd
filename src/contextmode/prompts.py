"""Every prompt the LLM-backed processors send, in one place, versioned.

Each `Prompt` has a Chinese and an English wording (picked by the language of
the user's text) and a ``version`` that changes whenever its wording changes,
so logs and stored derived records can say which prompt produced them
(``rewrite@1``). Templates use ``str.format`` fields; literal braces are doubled. User text is only
ever substituted into fields, inside tags that mark it as data, never as
instructions.

The five follow-up templates (detail / simplify / example / summary /
pronoun) live with the intent classifier in `contextmode.processors.intents`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import ChatMessage

__all__ = [
    "CONSTRAINTS",
    "DETECT",
    "EMOTION",
    "PROMPTS",
    "REWRITE",
    "SUMMARY",
    "Prompt",
]


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """A system + user prompt pair in Chinese and English."""

    name: str
    """Stable identifier (``rewrite``, ``summary``…)."""
    version: int
    """Bumped whenever any wording below changes."""
    system_zh: str
    """Chinese system message."""
    user_zh: str
    """Chinese user message template (``str.format`` fields)."""
    system_en: str
    """English system message."""
    user_en: str
    """English user message template, same fields as ``user_zh``."""

    @property
    def tag(self) -> str:
        """``name@version``, for logs and metadata."""
        return f"{self.name}@{self.version}"

    def render(self, *, chinese: bool, **fields: object) -> list[ChatMessage]:
        """The two messages to send, with ``fields`` substituted into both templates."""
        system, user = (self.system_zh, self.user_zh) if chinese else (self.system_en, self.user_en)
        return [
            ChatMessage(role="system", content=system.format(**fields)),
            ChatMessage(role="user", content=user.format(**fields)),
        ]


DETECT = Prompt(
    name="detect",
    version=1,
    system_zh=(
        "你判断用户的最新消息能否脱离对话历史被单独理解。"
        "如果它依赖历史（代词如“它/那个/这些”、省略了对象、“继续”“举个例子”“为什么”等追问），回答 yes；"
        "如果它本身完整、换了新话题或只是寒暄，回答 no。只输出 yes 或 no。"
    ),
    user_zh="<历史>\n{history}\n</历史>\n\n<最新消息>\n{message}\n</最新消息>\n\n需要历史才能理解吗？只回答 yes 或 no。",
    system_en=(
        "You decide whether the user's newest message can be understood without the conversation history. "
        "Answer yes if it depends on the history (pronouns like it/that/those, an omitted object, follow-ups "
        "such as 'go on', 'an example?', 'why?'); answer no if it is complete on its own, starts a new topic "
        "or is small talk. Output only yes or no."
    ),
    user_en="<history>\n{history}\n</history>\n\n<newest_message>\n{message}\n</newest_message>\n\nDoes it need the history? Answer only yes or no.",
)
"""Context detection: does the message lean on earlier turns? Output ``yes``/``no``."""

REWRITE = Prompt(
    name="rewrite",
    version=1,
    system_zh=(
        "你是查询改写器。根据对话背景，把用户的最新消息改写成一个完整、独立、无歧义的问题："
        "把代词和省略的对象替换成历史中具体指代的内容，保留用户的原意、语气和所有数字，不要回答问题，"
        "不要添加历史中没有的信息。如果消息本身已经完整独立，原样输出。"
        "只输出改写后的问题本身，不要引号、不要前缀、不要解释。\n"
        "示例：历史在讨论空调制冷差，提到了极速制冷按钮；消息“那个按钮在哪?” → 空调遥控器上的极速制冷按钮在哪里?"
    ),
    user_zh="<对话摘要>\n{summary}\n</对话摘要>\n\n<最近对话>\n{history}\n</最近对话>\n\n<最新消息>\n{message}\n</最新消息>\n\n改写后的独立问题：",
    system_en=(
        "You rewrite queries. Using the conversation background, rewrite the user's newest message as one "
        "complete, standalone, unambiguous question: replace pronouns and omitted objects with what they refer "
        "to in the history, keep the user's intent, tone and every number, do not answer it and do not add "
        "facts the history does not contain. If the message is already standalone, output it unchanged. "
        "Output only the rewritten question: no quotes, no label, no explanation.\n"
        "Example: the history is about an air conditioner cooling poorly and its turbo-cool button; message "
        "'where is that button?' → Where is the turbo-cool button on the air conditioner's remote control?"
    ),
    user_en="<summary>\n{summary}\n</summary>\n\n<recent_turns>\n{history}\n</recent_turns>\n\n<newest_message>\n{message}\n</newest_message>\n\nStandalone question:",
)
"""Standalone rewrite of a follow-up: memory feeds only this step."""

SUMMARY = Prompt(
    name="summary",
    version=1,
    system_zh=(
        "你为对话维护一份增量摘要。把“已有摘要”和“新增对话”合并成一段连贯的新摘要，约 {target_length} 字以内。必须保留：\n"
        "1. 用户的偏好、要求和身份信息（如“不吃辣”“预算50元以内”）；\n"
        "2. 尚未完成的任务和待回答的问题；\n"
        "3. 所有具体数字、日期、金额、型号和名称，原样照抄，不要改写或取整；\n"
        "4. 用户的情绪：如果对话中出现情绪波动，保留情绪词汇原句，并标注情绪强度（1-5），例如“用户说‘我今天很难过’（情绪强度4）”。\n"
        "已有摘要中的信息除非被新对话明确推翻，否则不要丢弃。只输出摘要正文，不要标题或解释。"
    ),
    user_zh="<已有摘要>\n{previous}\n</已有摘要>\n\n<新增对话>\n{turns}\n</新增对话>\n\n新的摘要：",
    system_en=(
        "You maintain an incremental summary of a conversation. Merge the existing summary and the new turns "
        "into one coherent new summary of at most about {target_length} words. You must keep:\n"
        "1. the user's preferences, requirements and identity facts (e.g. 'no spicy food', 'budget under $50');\n"
        "2. open tasks and questions not answered yet;\n"
        "3. every exact number, date, amount, model and name, copied verbatim, never rounded;\n"
        "4. the user's emotions: when the user's mood shifts, keep their emotion words verbatim and mark the "
        "intensity (1-5), e.g. 'the user said \"I feel awful today\" (intensity 4)'.\n"
        "Do not drop anything from the existing summary unless the new turns clearly overturn it. "
        "Output only the summary text, no heading or explanation."
    ),
    user_en="<existing_summary>\n{previous}\n</existing_summary>\n\n<new_turns>\n{turns}\n</new_turns>\n\nNew summary:",
)
"""Incremental summary: keeps preferences, open tasks, numbers, emotions 1–5."""

CONSTRAINTS = Prompt(
    name="constraints",
    version=1,
    system_zh=(
        "你从用户的一句话里提取需要长期记住的约束、偏好和身份信息。只提取用户本人明确说出的内容，"
        "不要推测；用户撤回的旧约束放进 remove。key 用简短的英文小写单词：单值信息用 name、age、location、job、"
        "budget、spice、diet，可以有多个的用 like:事物、dislike:事物、allergy:事物、family:称谓、avoid:事物；"
        "和“已记住的约束”同一件事时沿用它的 key。kind 取 preference、constraint、identity、fact 之一。"
        "quote 是用户原话中对应的片段。没有可提取的内容时输出 {{\"upsert\": [], \"remove\": []}}。\n"
        "只输出一个 JSON 对象，不要任何多余文字，不要代码块。格式示例：\n"
        '{{"upsert": [{{"key": "spice", "value": "不要辣", "kind": "preference", "quote": "我不吃辣"}}, '
        '{{"key": "budget", "value": "预算50元以内", "kind": "constraint", "quote": "价格控制在五十以内"}}], '
        '"remove": ["location"]}}'
    ),
    user_zh="<已记住的约束>\n{current}\n</已记住的约束>\n\n<用户的话>\n{message}\n</用户的话>\n\nJSON：",
    system_en=(
        "You extract, from one user message, the constraints, preferences and identity facts worth remembering "
        "for the rest of the conversation. Extract only what the user states explicitly, never guess; put old "
        "constraints the user retracts in remove. key is short, lowercase English: name, age, location, job, "
        "budget, spice, diet for one-valued facts, like:<thing>, dislike:<thing>, allergy:<thing>, family:<who>, "
        "avoid:<thing> for facts that can hold several values; reuse the key of a remembered constraint about "
        "the same thing. kind is one of preference, "
        "constraint, identity, fact. quote is the matching part of the user's words. When there is nothing to "
        "extract output {{\"upsert\": [], \"remove\": []}}.\n"
        "Output only one JSON object, no other text, no code fence. Example:\n"
        '{{"upsert": [{{"key": "spice", "value": "no spicy food", "kind": "preference", "quote": "I can\'t eat spicy"}}, '
        '{{"key": "budget", "value": "under $50", "kind": "constraint", "quote": "keep it under fifty"}}], '
        '"remove": ["location"]}}'
    ),
    user_en="<remembered_constraints>\n{current}\n</remembered_constraints>\n\n<user_message>\n{message}\n</user_message>\n\nJSON:",
)
"""Constraint extraction: one JSON object, shown by example."""

EMOTION = Prompt(
    name="emotion",
    version=1,
    system_zh=(
        "你评估一句话中说话人情绪的强度，0 到 1 之间：0 = 平静/中性（问事实、寒暄、早安晚安），"
        "0.3 = 轻微（有点累、有点烦），0.6 = 明显（很难过、很生气、压力很大），"
        "0.9 以上 = 强烈（崩溃、绝望、狂喜）。只看强度，不分正负。"
        '只输出一个 JSON 对象，例如 {{"intensity": 0.7, "emotion": "焦虑"}}，不要任何多余文字。'
    ),
    user_zh="<话>\n{text}\n</话>\n\nJSON：",
    system_en=(
        "You rate how intense the speaker's emotion is in one message, from 0 to 1: 0 = calm/neutral (factual "
        "questions, small talk, good morning), 0.3 = mild (a bit tired, slightly annoyed), 0.6 = clear (very "
        "sad, angry, stressed), 0.9 or more = overwhelming (breakdown, despair, elation). Rate intensity only, "
        'not whether it is positive or negative. Output only one JSON object such as {{"intensity": 0.7, '
        '"emotion": "anxious"}}, no other text.'
    ),
    user_en="<message>\n{text}\n</message>\n\nJSON:",
)
"""Emotion intensity 0–1 (key moments are turns above 0.7)."""

PROMPTS: dict[str, Prompt] = {p.name: p for p in (DETECT, REWRITE, SUMMARY, CONSTRAINTS, EMOTION)}
"""All prompts by name."""
