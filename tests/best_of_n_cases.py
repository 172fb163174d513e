"""The six questions and three temperatures chapter 07e's explorer offers, shared by its widget test
(tests/book/test_best_of_n_explorer.py) and its browser test (tests/site/test_best_of_n_explorer_browser.py)."""
from decodelab.toy.questions import question

# 老王 in 成都 is question 4, seeded 4 like the chapter's first table.
QUESTIONS = [question(p, c) for p, c in [("小明", "北京"), ("我的朋友", "上海"), ("刘叔叔", "广州"),
                                          ("隔壁的爷爷", "杭州"), ("老王", "成都"), ("妈妈", "西安")]]
TEMPERATURES = (0.7, 1.0, 1.5)
