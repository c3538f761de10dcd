"""Chinese and English patterns of the offline constraint extractor.

Each rule takes one sentence and returns what it found: `Found` (a key, a short value, a
kind) or `Retract` (which pinned entries the user took back). Rules are tried in order and
all that match count; the generic first-person rule runs only when no typed rule matched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from ...types import Constraint, ConstraintKind

__all__ = [
    "EN_STOPWORDS",
    "Found",
    "Retract",
    "Rule",
    "en_generic",
    "en_rules",
    "is_fact_head",
    "normalise",
    "zh_generic",
    "zh_rules",
]


@dataclass(frozen=True, kw_only=True)
class Found:
    key: str
    value: str
    kind: ConstraintKind
    matched: str = ""
    """The words the rule read (set by the rule), so no other rule pins them again."""


@dataclass(frozen=True, kw_only=True)
class Retract:
    """A statement that takes back pinned entries: by exact ``key``, or by key ``prefix``
    whose value or key mentions one of ``mentions``."""

    key: str | None = None
    prefix: str | None = None
    mentions: tuple[str, ...] = ()
    matched: str = ""
    """The words the rule read (set by the rule), so no other rule pins them again."""

    def matches(self, constraint: Constraint) -> bool:
        if self.key is not None and constraint.key == self.key:
            return True
        if self.prefix is None or not constraint.key.startswith(self.prefix):
            return False
        text = f"{constraint.key} {constraint.value}".lower()
        return not self.mentions or any(m.lower() in text for m in self.mentions)


Rule = Callable[[str], list[Found | Retract]]

_STOPWORDS_TEXT = """
a an the and or but so to of in on at for with from by about as into over after before
than then too very really just also i me my mine myself we us our you your he him his
she her it its they them their this that these those is am are was were be been being
have has had do does did doing will would can could should shall may might must not no
yes there here what which who whom when where why how all any some much many more most
own same such only other im ive id ill dont doesnt didnt cant wont isnt arent wasnt s t
d ll m re ve get got go going gonna like well oh yeah lot lots thing things one
"""
EN_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())


def normalise(text: str, limit: int = 3) -> str:
    """A key fragment: the first ``limit`` content words of ``text``, lower case (CJK kept)."""
    text = text.strip(" ，。！？,.!?~")
    if re.search(r"[\u4e00-\u9fff]", text):
        return re.sub(r"[\s，。！？,.!?~的了]+", "", text)[:8]
    tokens = re.findall(r"[a-z0-9]+(?:['’][a-z]+)?", text.lower())
    words = [w for w in (t.replace("'", "").replace("’", "") for t in tokens) if w not in EN_STOPWORDS]
    return " ".join(words[:limit]) or text.lower()[:20]


def _rule(pattern: str, build: Callable[[re.Match[str]], list[Found | Retract]]) -> Rule:
    compiled = re.compile(pattern, re.IGNORECASE)

    def apply(sentence: str) -> list[Found | Retract]:
        out: list[Found | Retract] = []
        for match in compiled.finditer(sentence):
            out.extend(replace(hit, matched=match.group(0)) for hit in build(match))
        return out

    return apply


# --- Chinese ---------------------------------------------------------------------------

_NUM = r"[\d一二三四五六七八九十百千万两零〇.,]+"
_ZH_STOP = r"(?=[，。！？,.!?；;、\s]|$)"
_ZH_OBJ = r"([\u4e00-\u9fffA-Za-z0-9·]{1,12}?)"


@cache
def zh_rules() -> list[Rule]:
    """The Chinese rules, most specific first."""
    return [
        # 我现在能吃辣了 / 我又能吃辣了: the spice constraint is taken back.
        _rule(r"(?<!不)(?:现在|又|已经|开始|也)(?:能|可以|敢|会)?吃辣了?|(?<![不没])(?:能|可以|敢)吃辣了",
              lambda m: [Retract(key="spice")]),
        _rule(r"(?:不|别|不要|不能|不敢|没法|吃不了)(?:太|怎么|大)?(?:能|敢)?(?:吃|放|加|要)?(?:太|很)?辣(?:的|椒)?(?!的菜)",
              lambda m: [Found(key="spice", value="不吃辣", kind="constraint")]),
        _rule(r"(?<!不)(?:喜欢|爱)吃辣",
              lambda m: [Found(key="spice", value="喜欢吃辣", kind="preference")]),
        _rule(r"(?:不再|已经不|现在不)对" + _ZH_OBJ + r"过敏|对" + _ZH_OBJ + r"不过敏了",
              lambda m: [Retract(prefix="allergy:", mentions=(m.group(1) or m.group(2),))]),
        _rule(r"(?<!不再)(?<!已经不)(?<!现在不)对" + _ZH_OBJ + r"过敏(?!了吗)",
              lambda m: [Found(key=f"allergy:{normalise(m.group(1))}",
                               value=f"对{m.group(1)}过敏", kind="constraint")]),
        # 不用考虑预算了 / 预算不限: the budget is taken back.
        _rule(r"(?:不用|不必|别|无需)(?:再)?(?:考虑|管|在意|担心)预算|预算(?:就)?(?:不限|无所谓|随意|不是问题|没有(?:限制|上限))"
              r"|不限(?:制)?预算|(?:取消|去掉|不设)(?:了)?预算(?:限制|上限)?|没有预算(?:限制|上限)了?",
              lambda m: [Retract(key="budget")]),
        _rule(r"预算(人均|每人|每位)?(?:是|在|大概|大约|只有|控制在|不超过|改成|改为|改到|换成|变成|调到|调整到|调整为|提高到|提到|加到|涨到|降到|减到|变为)?\s*(" + _NUM + r")\s*(万|千|元|块钱?|rmb)?\s*(以内|以下|左右|之内)?",
              lambda m: [Found(key="budget", kind="constraint",
                               value=f"预算{m.group(1) or ''}{m.group(2)}{m.group(3) or '元'}{m.group(4) or ''}")]),
        _rule(r"(?:价格|价钱|花费|费用|钱)?(?:控制在|不超过|别超过|不要超过|不能超过)\s*(" + _NUM + r")\s*(万|千|元|块钱?)?(以内|以下|之内)?",
              lambda m: [Found(key="budget", kind="constraint",
                               value=f"预算{m.group(1)}{m.group(2) or '元'}{m.group(3) or '以内'}")]),
        _rule(r"我(?:的名字)?(?:叫|是)([\u4e00-\u9fff]{2,3})" + r"(?=[，。！？,.!?；\s]|$)(?<!学生)",
              lambda m: [Found(key="name", value=f"名字: {m.group(1)}", kind="identity")]
              if m.group(0).startswith(("我叫", "我的名字")) else []),
        _rule(r"我(?:今年|已经)?(" + _NUM + r")岁",
              lambda m: [Found(key="age", value=f"{m.group(1)}岁", kind="identity")]),
        _rule(r"(?:我|^|[，,])(?:住在|家在|来自|老家在|搬到了?)([\u4e00-\u9fffA-Za-z]{2,10}?)" + _ZH_STOP,
              lambda m: [Found(key="location", value=f"住在{m.group(1)}", kind="identity")]),
        _rule(r"我是([\u4e00-\u9fff]{2,4})人" + _ZH_STOP,
              lambda m: [Found(key="hometown", value=f"{m.group(1)}人", kind="identity")]),
        _rule(r"我(?:现在)?(?:是|当)(?:一名|一个|个|名)?([\u4e00-\u9fff]{0,6}(?:学生|老师|医生|护士|工程师|程序员|设计师|律师|会计|司机|厨师|警察|销售|经理|老板|主管|研究生|博士|本科生|大学生|高中生|初中生|小学生|妈妈|爸爸|宝妈|家庭主妇|自由职业者|公务员|员工|作家|记者|演员|歌手|画家|学者|教授|研究员))",
              lambda m: [Found(key="job", value=f"身份: {m.group(1)}", kind="identity")]),
        _rule(r"(?:我|^|[，,])(?:现在|目前)?在([\u4e00-\u9fffA-Za-z0-9]{2,12}?)(?:工作|上班|上学|读书|实习)",
              lambda m: [Found(key="workplace", value=f"在{m.group(1)}", kind="identity")]),
        _rule(r"我(?:有|养了?)((?:一|两|二|三|四|五|\d)?(?:个|只|条|位)?)(孩子|儿子|女儿|猫|狗|宠物|男朋友|女朋友|老公|老婆|妻子|丈夫)",
              lambda m: [Found(key=f"family:{m.group(2)}", kind="identity",
                               value=f"有{m.group(1) or ''}{m.group(2)}")]),
        _rule(r"我(?:不再|已经不|现在不)(?:喜欢|爱)" + _ZH_OBJ + r"了?" + _ZH_STOP,
              lambda m: [Retract(prefix="like:", mentions=(m.group(1).rstrip("了"),))]),
        _rule(r"我(?:很|特别|非常|超|最|比较|挺|也|一直|真的)?(?<!不)(?:喜欢|爱|爱吃|爱喝|爱听|爱看|喜爱|偏爱)" + _ZH_OBJ + _ZH_STOP,
              lambda m: [] if m.group(1) in ("你", "他", "她") else
              [Found(key=f"like:{normalise(m.group(1))}", value=f"喜欢{m.group(1)}", kind="preference")]),
        _rule(r"我(?:很|特别|非常|最|比较|挺)?(?:不喜欢|讨厌|不爱|受不了|烦)" + _ZH_OBJ + _ZH_STOP,
              lambda m: [Found(key=f"dislike:{normalise(m.group(1))}", value=f"不喜欢{m.group(1)}",
                               kind="preference")]),
        # 我现在吃肉了 / 我又吃肉了: a vegetarian diet (or 不吃肉) is taken back.
        _rule(r"(?:现在|又|重新|开始)(?:能|可以)?吃" + _ZH_OBJ + r"了",
              lambda m: [Retract(prefix="diet", mentions=(m.group(1), *(("素",) if "肉" in m.group(1) or "荤" in m.group(1) else ()))),
                         Retract(prefix="avoid:", mentions=(m.group(1),))]),
        _rule(r"我(?:吃素|是素食者|是素食主义者)",
              lambda m: [Found(key="diet", value="吃素", kind="constraint")]),
        _rule(r"(?:我|^|[，,])(?:晚上|平时|一般|现在|从来)?(?:不吃|不喝|戒了|忌口|不想吃|不能吃|吃不了)(?:太)?" + _ZH_OBJ + _ZH_STOP,
              lambda m: [] if "辣" in m.group(1) else
              [Found(key=f"diet:{normalise(m.group(1))}", value=f"不吃{m.group(1)}", kind="constraint")]),
        _rule(r"(?:^|[，,。]|我|请)(?:不要|别|不用|不想要)(?:给我|给|帮我)?(?:放|加|推荐|带|点|安排)" + _ZH_OBJ + _ZH_STOP,
              lambda m: [Found(key=f"avoid:{normalise(m.group(1))}", value=f"不要{m.group(1)}",
                               kind="constraint")]),
    ]


_ZH_FIRST_PERSON = re.compile(
    # A whole clause about the user alone: it starts the clause, "我们" (the user and others)
    # is not the user, and it ends where the clause ends (never cut mid-word).
    r"(?:^|(?<=[，。！？,.!?；、\s]))我(?!们)(?:每天|经常|一直|平时|周末|现在|最近|正在|也|还|一般|周末一般)?"
    r"(?:有|在|养|住|做|学|开|玩|去|练|考)[^，。！？,.!?；、]{2,24}(?=[，。！？,.!?；、\s]|$)"
)


def zh_generic(sentence: str) -> list[Found | Retract]:
    """Other first-person facts ("我每天跑步五公里"), as low-priority ``fact`` entries."""
    out: list[Found | Retract] = []
    for match in _ZH_FIRST_PERSON.finditer(sentence):
        text = match.group()
        if re.search(r"我在(?:想|看|说|问|听|等)|我们?在一起", text):
            continue
        out.append(Found(key=f"fact:{normalise(text)}", value=text, kind="fact"))
    return out[:2]


# --- English ---------------------------------------------------------------------------

_EN_OBJ = r"([^,.;!?]{2,60}?)(?=\s+(?:but|because|since|and i|so i|though|which)\b|[,.;!?]|$)"
_COUNT = r"(a|an|one|two|three|four|five|six|seven|\d+)"


_EN_AMOUNT = (
    r"(?:(around|about|roughly|under|below|up to|at most|max(?:imum)?|less than|no more than|over|at least)\s+)?"
    r"((?:\$|usd ?|rmb ?|¥|€|£)?\d[\d,]*(?:\.\d+)?k?)"
    r"(?:\s*(dollars|yuan|euros|pounds|bucks|usd|rmb))?"
    r"(?:\s+((?:per|a|each) (?:meal|person|head|night|day|week|month|trip)))?"
)
_EN_BUDGET = (
    # "raise the budget to $40", "let's lower our budget to 30 dollars per meal"
    r"(?:(?:raise|increase|bump|up|lift|lower|reduce|cut|drop|decrease|change|set|adjust|update|move|make|put)"
    r"\s+(?:up\s+|down\s+)?(?:my |the |our )?budget(?: limit)?(?:\s+(?:up|down))?\s+(?:to|at)\s+"
    # "my budget is $20 per meal", "the budget is now $30", "budget: $25", "a budget of around $300"
    r"|(?:my |the |our |a )?budget(?: limit)?(?:\s*:\s*|\s+(?:is|of|will be|should be|goes up to|goes down to)\s+)?"
    r"(?:(?:now|still|only|just|set to|changed to|raised to|lowered to)\s+)?)\s*" + _EN_AMOUNT
)
_EN_BUDGET_GONE = (
    # "forget the budget", "no budget limit anymore", "I don't have a budget anymore"
    r"(?:forget|drop|remove|ignore|scrap|cancel|never ?mind)(?: about)? (?:my |the |our |that )?budget"
    r"|(?:there(?:'s| is) )?no (?:more )?budget(?: limit)? (?:any ?more|now)"
    r"|no budget limit|I (?:no longer|don't|do not) have a budget"
    r"|budget (?:doesn't|does not|no longer) matters?|money is no (?:object|issue|problem)"
)


def _budget(match: re.Match[str]) -> list[Found | Retract]:
    """``budget under $50 per meal``: the amount with the words around it that qualify it."""
    words = [w for w in match.groups() if w]
    return [Found(key="budget", value="budget " + " ".join(words), kind="constraint")]


_EN_DANGLING = frozenset(["to", "it", "that", "this", "them", "a", "an", "the", "so", "too", "and", "or", "of", "for", "with", "at", "in", "on", "my", "your"])
"""A value ending in one of these ("likes to" from "I love to.") is a fragment, not a fact."""


def _en(pattern: str, build: Callable[[re.Match[str]], list[Found | Retract]]) -> Rule:
    def whole(match: re.Match[str]) -> list[Found | Retract]:
        return [h for h in build(match)
                if not (isinstance(h, Found) and h.value.split()[-1].lower() in _EN_DANGLING)]

    return _rule(r"(?<![A-Za-z'])" + pattern, whole)


def _obj(match: re.Match[str], group: int = 1) -> str:
    return re.sub(r"\s+(?:any ?more|now|again|these days|lately)$", "", match.group(group).strip())


@cache
def en_rules() -> list[Rule]:
    """The English rules, most specific first."""
    return [
        _en(r"I (?:can |do )?(?:eat|eating|have|started eating|eat some) (meat|fish|chicken|beef|pork|dairy|eggs?|gluten|sugar)(?: again| now)",
            lambda m: [Retract(prefix="diet", mentions=(m.group(1).lower(), "vegetarian", "vegan"))]),
        _en(r"I(?:'m| am) (?:not|no longer) (?:a )?(vegetarian|vegan|pescatarian)(?: any ?more| now)?",
            lambda m: [Retract(prefix="diet")]),
        _en(r"I(?:'m| am) (?:a |an |now )?(vegetarian|vegan|pescatarian)",
            lambda m: [Found(key="diet", value=m.group(1).lower(), kind="constraint")]),
        _en(r"I (?:don't|do not|can't|cannot|never) eat (?!spicy|hot food)" + _EN_OBJ,
            lambda m: [Found(key=f"diet:{normalise(_obj(m))}", value=f"doesn't eat {_obj(m)}",
                             kind="constraint")]),
        _en(r"I(?:'m| am) (?:not|no longer) allergic to " + _EN_OBJ,
            lambda m: [Retract(prefix="allergy:", mentions=(normalise(_obj(m)),))]),
        _en(r"I(?:'m| am) (?:very |severely |deathly )?allergic to " + _EN_OBJ,
            lambda m: [Found(key=f"allergy:{normalise(_obj(m))}", value=f"allergic to {_obj(m)}",
                             kind="constraint")]),
        _en(r"I (?:can (?:eat|handle)|eat|like|love) spicy(?: food)?(?: now| again)",
            lambda m: [Retract(key="spice")]),
        _en(r"(?:no|not|nothing|without|can't (?:eat|handle)|don't (?:eat|like)) (?:too )?spicy",
            lambda m: [Found(key="spice", value="no spicy food", kind="constraint")]),
        _en(_EN_BUDGET_GONE, lambda m: [Retract(key="budget")]),
        _en(_EN_BUDGET, _budget),
        _en(r"(?:my name is|call me|my name's) ([A-Z][a-z]+)",
            lambda m: [Found(key="name", value=f"name: {m.group(1)}", kind="identity")]),
        _en(r"I(?:'m| am) (\d{1,2})(?: years old| yrs old|\b)(?! (?:minutes|hours|miles|times|months|weeks|days|percent|%))",
            lambda m: [Found(key="age", value=f"age {m.group(1)}", kind="identity")]),
        _en(r"I (?:don't|do not|no longer) live in " + _EN_OBJ,
            lambda m: [Retract(key="location")]),
        _en(r"I (?:live|lived|grew up|was born|reside|moved|just moved|recently moved) (?:in|to|near|on|by) " + _EN_OBJ,
            lambda m: [Found(key="location", value=f"lives in {_obj(m)}", kind="identity")]),
        _en(r"I(?:'m| am) (?:originally )?from " + _EN_OBJ,
            lambda m: [Found(key="hometown", value=f"from {_obj(m)}", kind="identity")]),
        _en(r"I (?:quit|lost|left) my job",
            lambda m: [Retract(key="job")]),
        _en(r"I (?:work|am working|'m working|worked) (?:as|at|in|for|on) " + _EN_OBJ,
            lambda m: [Found(key="job", value=f"works {m.group(0).split()[2]} {_obj(m)}",
                             kind="identity")]),
        _en(r"I(?:'m| am) (?:a|an) (?:big |huge |great )?fan of " + _EN_OBJ,
            lambda m: [Found(key=f"like:{normalise(_obj(m))}", value=f"fan of {_obj(m)}", kind="preference")]),
        _en(r"I(?:'m| am) (?:a|an) ((?:\w+ ){0,2}(?:student|teacher|nurse|doctor|engineer|developer|programmer|designer|lawyer|accountant|driver|chef|cook|officer|manager|mom|mother|dad|father|parent|writer|artist|musician|singer|farmer|mechanic|scientist|veteran|retiree|housewife|firefighter|cashier|waitress|waiter|librarian|pilot|vet|dentist|therapist|professor|coach|athlete|photographer))\b",
            lambda m: [Found(key="job", value=f"is a {m.group(1)}", kind="identity")]),
        _en(r"I (?:have|'ve got|got) " + _COUNT + r" (?:\w+ )?(kids?|children|child|sons?|daughters?|brothers?|sisters?|dogs?|cats?|pets?|grandchildren|grandkids|husband|wife|boyfriend|girlfriend|horses?|birds?)\b",
            lambda m: [Found(key=f"family:{re.sub(r'(ren|s)$', '', m.group(2).lower())}",
                             value=f"has {m.group(1)} {m.group(2)}", kind="identity")]),
        _en(r"my favou?rite (\w+(?: \w+)?) (?:is|are) " + _EN_OBJ,
            lambda m: [Found(key=f"favorite:{normalise(m.group(1))}",
                             value=f"favorite {m.group(1)}: {_obj(m, 2)}", kind="preference")]),
        _en(r"I (?:don't|do not) (?:like|love|enjoy) (\w+(?: \w+)?) any ?more|I no longer (?:like|love|enjoy) " + _EN_OBJ,
            lambda m: [Retract(prefix="like:", mentions=(normalise(m.group(1) or m.group(2)),))]),
        _en(r"I (?:really |absolutely |also |just |totally )?(?:hate|dislike|can't stand|don't like|do not like|don't enjoy) " + _EN_OBJ,
            lambda m: [Found(key=f"dislike:{normalise(_obj(m))}", value=f"dislikes {_obj(m)}",
                             kind="preference")]),
        _en(r"I (?:really |absolutely |also |just |totally |still )?(?:love|like|enjoy|adore|prefer) (?!(?:it|that|this|them|those|these|you|your|him|her|to hear|hearing)\b)" + _EN_OBJ,
            lambda m: [Found(key=f"like:{normalise(_obj(m))}", value=f"likes {_obj(m)}", kind="preference")]),
    ]


_EN_FIRST_PERSON = re.compile(
    r"(?<![A-Za-z'])(?:I|I'm|I've|I'd|We|We're|We've|My|Our)\s+[^,.;!?]{6,90}?"
    r"(?=\s+(?:but|because|since|though|which|so that)\b|[,.;!?]|$)"
)
_EN_ADVERB = r"(?:also |really |still |usually |actually |only |just |currently |now |often |always |mostly )?"
_EN_FACT_HEAD = re.compile(
    r"^(?:I|We)\s+" + _EN_ADVERB + r"(?:"
    r"love|live|play|work|teach|own|read|hate|spend|grew up|used to|go to|study|studied|"
    r"collect|volunteer|drive|ride|run|bake|cook|sing|write|paint|draw|coach|train|practice|"
    r"listen|travel|raise|grow|build|prefer|enjoy|"
    r"have (?:a|an|two|three|four|five|\d+|been|always|never|my|some|no|lots)|"
    r"'ve (?:a|an|got|been|always|never)|"
    r"(?:am|'m|are|'re) (?:a|an|from|retired|married|single|divorced|pregnant|currently|"
    r"studying|working|learning|taking|trying|planning|saving|vegan|vegetarian|allergic|"
    r"afraid|scared|terrified|big|huge|still)|"
    r"was born|got (?:a|an|married|divorced|my)"
    r")\b"
    r"|^(?:My|Our)\s+(?:wife|husband|son|daughter|kids|children|dad|father|mom|mother|parents|"
    r"family|brother|sister|boyfriend|girlfriend|dog|cat|job|favou?rite|grandma|grandpa|"
    r"grandmother|grandfather|best friend|hobby|hobbies|house|home|car|boss)\b",
    re.IGNORECASE,
)
_EN_HEDGE = re.compile(
    r"^(?:I|We)(?:'m| am| are|'re|'d| would| will|'ll| do| did| can| could| just| really)?\s*"
    r"(?:not\s+)?(?:think|thought|guess|hope|bet|wonder|mean|agree|understand|see|know|"
    r"imagine|suppose|believe|sorry|glad|sure|so|feel|felt|love to|like to|would|could|should|"
    r"can|can't|cannot|might|may|will|won't|wouldn't|wish|need|totally|definitely|too|also think|"
    r"appreciate|thank|haven't|have never|never|didn't|don't know|was wondering|get it|got it|"
    r"heard|remember|forgot|recommend|found|saw|told|said|asked|noticed|hear|am happy for|"
    r"'m happy for|just wanted|was just|was going|'m going to|am going to|hate to|have to|"
    r"had to|tried|'ll|will)\b",
    re.IGNORECASE,
)
_PRONOUN_OBJECT = re.compile(r"\b(?:it|them|that|this|those|these|him|her|one)\s*$", re.IGNORECASE)


def is_fact_head(clause: str) -> bool:
    """True when a clause opens like a typical self-description ("I work…", "My wife…")."""
    return bool(_EN_FACT_HEAD.match(clause)) or clause.startswith("我")


def en_generic(sentence: str) -> list[Found | Retract]:
    """Other first-person statements ("I play guitar in a band"), as ``fact`` entries."""
    out: list[Found | Retract] = []
    for match in _EN_FIRST_PERSON.finditer(sentence):
        text = match.group().strip()
        if _PRONOUN_OBJECT.search(text) or (
            _EN_HEDGE.match(text) and not _EN_FACT_HEAD.match(text)
        ):
            continue
        key = normalise(text, limit=4)
        if len(key.split()) < 2:
            continue
        out.append(Found(key=f"fact:{key}", value=text, kind="fact"))
    return out[:3]
