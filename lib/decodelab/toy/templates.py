"""The grammar of the toy language: weighted word classes and the sentence templates that use them.

Pure data. A template is literal text with `{CLASS}` slots; each slot is filled with one word of its class. Words and
templates are listed in rank order and weighted by a Zipf law, so some slots are flat (every place equally likely) and
others peaked. `decodelab.toy.automaton` compiles this grammar into a character automaton.

Taught in: chapters/00-intro.md (what the language is)
"""
from __future__ import annotations

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
