"""A ground-truth toy language of short Chinese sentences whose next-character distribution is known exactly.

A weighted grammar (templates made of literal text and word classes, every word with a weight) is compiled
into a probabilistic automaton over characters. Each word class becomes a trie; an automaton position is
(template, element, trie node). `next_token_probs` runs the forward algorithm over the set of positions that
are consistent with the prefix, so templates that share a beginning are marginalised exactly.

The grammar is unambiguous (every sentence has exactly one derivation; `is_unambiguous()` checks it), so
the entropy of a sentence equals the entropy of its derivation path, which the automaton gives in closed form.

Taught in: chapters/01-logits-to-probs.ipynb (the truth behind every figure), chapters/03-strategies.ipynb.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass

# Word classes: (space-separated words in rank order, Zipf exponent). Weight of rank r is 1 / (r + 1) ** alpha,
# so alpha = 0 is a flat slot and a larger alpha a peaked one.
_CLASSES: dict[str, tuple[str, float]] = {
    "PERSON": ("小明 小红 老王 李老师 张医生 王奶奶 刘叔叔 陈阿姨 我的朋友 他的妹妹 她的哥哥 那个孩子 "
               "我们班长 新来的同学 隔壁的爷爷 小李 妈妈 爸爸 姐姐 弟弟", 0.7),
    "TIME": ("今天 昨天 明天 早上 晚上 周末 下午 中午 星期一 星期五 去年夏天 那天晚上 春节的时候", 0.6),
    "PLACE": ("公园 学校 图书馆 超市 医院 火车站 河边 山上 海边 厨房 花园 教室 操场 博物馆 银行 饭店 书店 "
              "办公室 菜市场 动物园 电影院 咖啡馆 体育馆 广场 机场 邮局 游泳池 村口 楼下 家里", 0.0),
    "ACT": ("跑步 看书 唱歌 跳舞 画画 写字 钓鱼 下棋 打篮球 踢足球 游泳 散步 拍照 聊天 休息 做作业 "
            "放风筝 打太极拳 弹钢琴 喝茶 吃午饭 买东西", 0.3),
    "FOOD": ("米饭 面条 饺子 包子 苹果 西瓜 香蕉 葡萄 鸡蛋 豆腐 牛肉 鱼汤 蛋糕 馒头 青菜 橘子 草莓 火锅 "
             "月饼 烤鸭 汤圆 粽子", 0.5),
    "DRINK": ("茶 咖啡 牛奶 果汁 热水 豆浆 可乐 绿茶 红茶 柠檬水", 0.8),
    "VEHICLE": ("公交车 地铁 自行车 火车 飞机 出租车 船 高铁", 0.6),
    "CITY": ("北京 上海 广州 杭州 成都 西安 南京 武汉 重庆 深圳 天津 苏州 长沙 昆明 青岛 厦门 拉萨 哈尔滨 "
             "桂林 大连", 0.0),
    "WEATHER": ("下雨 下雪 刮大风 太热 太冷 有雾 打雷", 0.7),
    "HOMEACT": ("看电视 睡觉 做饭 打扫房间 听音乐 玩游戏 写作业 包饺子 看电影 读小说", 0.4),
    "FEEL": ("累 高兴 开心 难过 紧张 生气 害怕 饿 困 着急", 0.6),
    "DEGREE": ("很 非常 有点 特别 真的很", 1.0),
    "BELONGING": ("衣服 帽子 裙子 鞋子 外套 围巾 裤子 手套 雨伞 书包", 0.5),
    "COLOR": ("红色 蓝色 白色 黑色 绿色 黄色 紫色 灰色 粉色 橙色", 0.5),
    "NUM": ("一 两 三 四 五 六 七 八 九 十", 1.0),
    "MEASURED": ("本书 个苹果 杯茶 张纸 支笔 朵花 条鱼 件衣服 双鞋 斤葡萄 瓶水 把伞 盒牛奶 块蛋糕", 0.5),
    "ANIMAL": ("小猫 小狗 兔子 老虎 熊猫 狐狸 小鸟 金鱼 乌龟 松鼠 猴子 大象 小鸭子 蝴蝶", 0.6),
    "NATURE": ("树上 草地上 河里 院子里 窝里 花丛中 树林里 沙发上", 0.5),
    "ANIMALACT": ("睡觉 吃东西 玩耍 晒太阳 找妈妈 跳来跳去", 0.5),
    "SUBJECT": ("数学 语文 英语 历史 地理 音乐 美术 物理 化学 体育 科学", 0.5),
    "THING": ("书 钥匙 手机 杯子 眼镜 钱包 作业本 铅笔", 0.5),
    "SPOT": ("桌子上 床上 椅子上 书包里 抽屉里 门口 窗台上 冰箱里", 0.5),
    "WHOM": ("你 您 大家 老师 妈妈 爷爷", 0.8),
    "WISH": ("生日快乐 新年快乐 身体健康 工作顺利 学习进步 万事如意 一路平安 心想事成", 0.5),
    "POEM": ("床前明月光，疑是地上霜。 举头望明月，低头思故乡。 春眠不觉晓，处处闻啼鸟。 白日依山尽，黄河入海流。 "
             "欲穷千里目，更上一层楼。 两个黄鹂鸣翠柳，一行白鹭上青天。", 0.3),
    "MONK": ("老和尚 小和尚", 0.0),
    "DAYPART": ("早上 晚上 下午 中午 饭后", 0.5),
}

# Sentence patterns in rank order; weight of rank r is 1 / (r + 1) ** _TEMPLATE_ALPHA.
_TEMPLATES: tuple[str, ...] = (
    "{TIME}，{PERSON}在{PLACE}{ACT}。",
    "{PERSON}喜欢吃{FOOD}。",
    "{PERSON}在{PLACE}{ACT}。",
    "{PERSON}坐{VEHICLE}去{CITY}。",
    "{PERSON}想喝一杯{DRINK}。",
    "{PERSON}买了{NUM}{MEASURED}。",
    "{TIME}天气很好，{PERSON}想去{PLACE}。",
    "{ANIMAL}在{NATURE}{ANIMALACT}。",
    "因为{WEATHER}了，所以{PERSON}没有去{PLACE}。",
    "{PERSON}的{BELONGING}是{COLOR}的。",
    "如果明天{WEATHER}，{PERSON}就在家{HOMEACT}。",
    "{PERSON}一边{ACT}，一边{ACT}。",
    "虽然{PERSON}{DEGREE}{FEEL}，但是还是去了{PLACE}。",
    "{ANIMAL}和{ANIMAL}是好朋友。",
    "{PERSON}把{THING}放在{SPOT}了。",
    "{PERSON}觉得{FOOD}{DEGREE}好吃。",
    "祝{WHOM}{WISH}！",
    "{PERSON}每天{DAYPART}都{ACT}。",
    "这是{PERSON}的{THING}。",
    "{PERSON}问：“你今天{ACT}了吗？”",
    "请问，去{PLACE}怎么走？",
    "你知道{CITY}在哪里吗？",
    "{PERSON}最喜欢的课是{SUBJECT}。",
    "我们{TIME}一起去{CITY}旅游吧！",
    "{PERSON}正在{PLACE}等{PERSON}。",
    "{POEM}",
    "从前有一座山，山里有一座庙，庙里有一个{MONK}。",
)
_TEMPLATE_ALPHA = 0.5


@dataclass(frozen=True)
class _Edge:
    """One outgoing choice of an automaton position: emit `char` (None = end of text) and move to `target`."""

    char: str | None
    target: int
    prob: float


class _Trie:
    """A weighted word trie; node n has `mass[n]` (words below it) and `end[n]` (the word ending at it)."""

    def __init__(self, words: list[tuple[str, float]]):
        self.children: list[dict[str, int]] = [{}]
        self.mass: list[float] = [0.0]
        self.end: list[float] = [0.0]
        for word, weight in words:
            node = 0
            self.mass[0] += weight
            for ch in word:
                if ch not in self.children[node]:
                    self.children[node][ch] = len(self.mass)
                    self.children.append({})
                    self.mass.append(0.0)
                    self.end.append(0.0)
                node = self.children[node][ch]
                self.mass[node] += weight
            self.end[node] += weight


def _parse_template(template: str) -> list[str]:
    """Split "{A}在{B}" into element names; literal text becomes a one-word class named by its text."""
    elements, literal, i = [], "", 0
    while i < len(template):
        if template[i] == "{":
            close = template.index("}", i)
            if literal:
                elements.append("=" + literal)
                literal = ""
            elements.append(template[i + 1:close])
            i = close + 1
        else:
            literal += template[i]
            i += 1
    if literal:
        elements.append("=" + literal)
    return elements


class ToyLanguage:
    """The ground-truth language: exact next-character probabilities, log-probabilities and entropy rate.

    Texts are plain strings without BOS/EOS; the end of text is the key `ToyLanguage.EOS` in `next_token_probs`.

    >>> lang = ToyLanguage()
    >>> probs = lang.next_token_probs("床前明月光，疑是地上")
    >>> round(probs["霜"], 6)
    1.0

    Taught in: chapters/01-logits-to-probs.ipynb
    """

    EOS = "</s>"

    def __init__(self) -> None:
        tries = {}
        for name, (words, alpha) in _CLASSES.items():
            tries[name] = _Trie([(w, 1.0 / (r + 1) ** alpha) for r, w in enumerate(words.split())])
        template_weights = [1.0 / (r + 1) ** _TEMPLATE_ALPHA for r in range(len(_TEMPLATES))]
        total = sum(template_weights)
        # position id <-> (template, element, trie node); id 0 is the start, before any template is chosen
        self._keys: list[tuple[int, int, int]] = [(-1, -1, -1)]
        self._ids: dict[tuple[int, int, int], int] = {}
        self._templates = [[tries.get(e) or _Trie([(e[1:], 1.0)]) for e in _parse_template(t)] for t in _TEMPLATES]
        self._edges: list[list[_Edge]] = []
        start_edges: list[_Edge] = []
        for t, weight in enumerate(template_weights):
            start_edges += self._closure(t, 0, 0, weight / total)
        self._edges.append(start_edges)
        done = 1
        while done < len(self._keys):  # compile every position reachable from the start
            self._edges.append(self._closure(*self._keys[done], 1.0))
            done += 1
        self._char_probs: list[dict[str, float]] = []
        for edges in self._edges:
            probs: dict[str, float] = {}
            for e in edges:
                key = self.EOS if e.char is None else e.char
                probs[key] = probs.get(key, 0.0) + e.prob
            self._char_probs.append(probs)
        self._cum = [list(_accumulate([e.prob for e in edges])) for edges in self._edges]
        self.alphabet: list[str] = sorted({c for probs in self._char_probs for c in probs if c != self.EOS})
        self._alphabet_set = frozenset(self.alphabet)
        self._visits = self._expected_visits()
        self._forward_cache: dict[str, tuple[dict[int, float], float]] = {"": ({0: 1.0}, 0.0)}

    # ---- compilation -------------------------------------------------------------------------------------
    def _position(self, t: int, e: int, node: int) -> int:
        key = (t, e, node)
        if key not in self._ids:
            self._ids[key] = len(self._keys)
            self._keys.append(key)
        return self._ids[key]

    def _closure(self, t: int, e: int, node: int, weight: float) -> list[_Edge]:
        """Outgoing edges of trie `node` of element `e` of template `t`, following word ends to later elements."""
        trie = self._templates[t][e]
        edges = [_Edge(ch, self._position(t, e, child), weight * trie.mass[child] / trie.mass[node])
                 for ch, child in trie.children[node].items()]
        if trie.end[node] > 0:
            w_end = weight * trie.end[node] / trie.mass[node]
            if e + 1 == len(self._templates[t]):
                edges.append(_Edge(None, -1, w_end))
            else:
                edges += self._closure(t, e + 1, 0, w_end)
        return edges

    def _expected_visits(self) -> list[float]:
        """Expected number of visits of each position per sentence (the automaton is acyclic)."""
        indegree = [0] * len(self._edges)
        for edges in self._edges:
            for e in edges:
                if e.target >= 0:
                    indegree[e.target] += 1
        visits = [0.0] * len(self._edges)
        visits[0] = 1.0
        ready = [0]
        while ready:
            pos = ready.pop()
            for e in self._edges[pos]:
                if e.target >= 0:
                    visits[e.target] += visits[pos] * e.prob
                    indegree[e.target] -= 1
                    if indegree[e.target] == 0:
                        ready.append(e.target)
        return visits

    # ---- input checks ------------------------------------------------------------------------------------
    def _check_text(self, text: str, name: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
        for ch in text:
            if ch not in self._alphabet_set:
                raise ValueError(f"{name} contains {ch!r}, which is not in the alphabet of the toy language "
                                 f"({len(self.alphabet)} characters, see ToyLanguage().alphabet)")

    # ---- forward algorithm -------------------------------------------------------------------------------
    def _forward(self, prefix: str) -> tuple[dict[int, float], float]:
        """Normalised weights of the positions consistent with `prefix`, and log P(prefix) (-inf if impossible)."""
        known = len(prefix)
        while prefix[:known] not in self._forward_cache:
            known -= 1
        state, logp = self._forward_cache[prefix[:known]]
        if len(self._forward_cache) > 500_000:
            self._forward_cache = {"": ({0: 1.0}, 0.0)}
        for i in range(known, len(prefix)):
            new: dict[int, float] = {}
            for pos, w in state.items():
                for e in self._edges[pos]:
                    if e.char == prefix[i]:
                        new[e.target] = new.get(e.target, 0.0) + w * e.prob
            total = sum(new.values())
            state, logp = ({p: w / total for p, w in new.items()}, logp + math.log(total)) if total > 0 \
                else ({}, -math.inf)
            self._forward_cache[prefix[:i + 1]] = (state, logp)
        return state, logp

    def next_token_probs(self, prefix: str) -> dict[str, float]:
        """Exact P(next char | prefix) over the alphabet and `EOS`, most probable first; only nonzero entries.

        Raises ValueError if the prefix has an unknown character or cannot start any sentence of the language.
        """
        self._check_text(prefix, "prefix")
        state, _ = self._forward(prefix)
        if not state:
            raise ValueError(f"prefix {prefix!r} cannot start any sentence of the toy language "
                             "(check with prefix_is_viable)")
        probs: dict[str, float] = {}
        for pos, w in state.items():
            for ch, p in self._char_probs[pos].items():
                probs[ch] = probs.get(ch, 0.0) + w * p
        return dict(sorted(probs.items(), key=lambda kv: -kv[1]))

    def entropy(self, prefix: str) -> float:
        """Entropy in nats of the next-character distribution after `prefix` (EOS included)."""
        return 0.0 - sum(p * math.log(p) for p in self.next_token_probs(prefix).values())

    def prefix_is_viable(self, prefix: str) -> bool:
        """True when some sentence of the language starts with `prefix`."""
        self._check_text(prefix, "prefix")
        return bool(self._forward(prefix)[0])

    def log_prob(self, text: str) -> float:
        """Natural log of P(text), the end of text included; -inf for texts the language cannot produce."""
        self._check_text(text, "text")
        state, logp = self._forward(text)
        p_end = sum(w * self._char_probs[pos].get(self.EOS, 0.0) for pos, w in state.items())
        return logp + math.log(p_end) if p_end > 0 else -math.inf

    def is_valid(self, text: str) -> bool:
        """True when the language produces `text` as a whole sentence."""
        return self.log_prob(text) > -math.inf

    # ---- sampling ----------------------------------------------------------------------------------------
    def sample(self, n: int, seed: int = 0) -> list[str]:
        """`n` sentences drawn independently from the language with a fixed `seed`."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {seed!r}")
        rng = random.Random(seed)
        texts = []
        for _ in range(n):
            pos, chars = 0, []
            while pos >= 0:
                cum = self._cum[pos]
                edge = self._edges[pos][min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)]
                if edge.char is not None:
                    chars.append(edge.char)
                pos = edge.target
            texts.append("".join(chars))
        return texts

    # ---- exact statistics --------------------------------------------------------------------------------
    def expected_length(self) -> float:
        """Expected number of characters per sentence (the end symbol not counted)."""
        return sum(v * (1.0 - cp.get(self.EOS, 0.0)) for v, cp in zip(self._visits, self._char_probs))

    def sentence_entropy(self) -> float:
        """Exact entropy in nats of a whole sentence, H(X) = E[-log P(X)] (unambiguous grammar: = path entropy)."""
        return -sum(v * sum(e.prob * math.log(e.prob) for e in edges if e.prob > 0)
                    for v, edges in zip(self._visits, self._edges))

    def entropy_rate(self) -> float:
        """Nats per character: H(X) / E[len(X) + 1], the sentence entropy over the expected length with the end.

        This is the cross-entropy per predicted token that a perfect model reaches on `<s> text </s>`,
        averaged over tokens of a large corpus (every character and the end symbol are predicted once).
        """
        return self.sentence_entropy() / (self.expected_length() + 1.0)

    def expected_char_counts(self) -> dict[str, float]:
        """Expected number of occurrences of each character per sentence."""
        counts = dict.fromkeys(self.alphabet, 0.0)
        for v, cp in zip(self._visits, self._char_probs):
            for ch, p in cp.items():
                if ch != self.EOS:
                    counts[ch] += v * p
        return counts

    def is_unambiguous(self) -> bool:
        """True when no sentence has two derivations (product-automaton check over pairs of positions)."""
        def step(pair: tuple[int, int]) -> dict[tuple[int, int], None]:
            out: dict[tuple[int, int], None] = {}
            for a in self._edges[pair[0]]:
                for b in self._edges[pair[1]]:
                    if a.char == b.char and a.char is not None:
                        out[(a.target, b.target)] = None
            return out

        seen, stack, successors = {(0, 0)}, [(0, 0)], {}
        while stack:
            pair = stack.pop()
            successors[pair] = step(pair)
            for nxt in successors[pair]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        # two different start edges reaching the same char are already distinct pairs, so (0, 0) covers them
        can_end = {p for p in seen if self.EOS in self._char_probs[p[0]] and self.EOS in self._char_probs[p[1]]}
        changed = True
        while changed:
            changed = False
            for pair in seen:
                if pair not in can_end and any(n in can_end for n in successors[pair]):
                    can_end.add(pair)
                    changed = True
        split = any(a != b for a, b in can_end)
        ends_twice = any(sum(1 for e in self._edges[p] if e.char is None) > 1 for p in range(len(self._edges)))
        return not split and not ends_twice

    # ---- example contexts for the chapters ---------------------------------------------------------------
    def flat_context(self) -> str:
        """A prefix where dozens of words fit next: after "在" comes one of 30 equally likely places."""
        return "小明在"

    def peaked_context(self) -> str:
        """A prefix inside a fixed phrase: the next character is certain."""
        return "床前明月光，疑是地上"

    def example_contexts(self) -> list[tuple[str, float]]:
        """A few prefixes from flat to peaked, each with its exact next-character entropy in nats."""
        prefixes = ["", "小明在", "你知道", "小明坐", "小明喜欢吃", "今天，小明在图书", "床前明月光，疑是地上"]
        return [(p, self.entropy(p)) for p in prefixes]


def _accumulate(values: list[float]) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out
