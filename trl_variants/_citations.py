"""BibTeX entries for the model cards (each trainer cites its paper and GRPO, which it extends)."""

GRPO = """@article{shao2024deepseekmath,
    title        = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author       = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
    year         = 2024,
    eprint       = {arXiv:2402.03300},
}"""

ERPO = """@misc{erpo2025,
    title        = {{Beyond the Stability-Exploration Dilemma: Environmental Regularization for LLM Policy Optimization}},
    author       = {Anonymous},
    year         = 2025,
    note         = {Preprint under double-blind review},
}"""


def paper(title: str, arxiv_id: str | None, entry: str) -> dict:
    """A ``_paper`` dict for TRL's model card: the method's entry first, then GRPO's."""
    return {"title": title, "id": arxiv_id, "citation": entry + "\n\n" + GRPO}

EEPO = """@article{chen2025eepo,
    title        = {{EEPO: Exploration-Enhanced Policy Optimization via Sample-Then-Forget}},
    author       = {Liang Chen and Xueting Han and Qizhou Wang and Bo Han and Jing Bai and Hinrich Sch{\\"u}tze and Kam-Fai Wong},
    year         = 2025,
    eprint       = {arXiv:2510.05837},
}"""

DPH = """@article{li2025choice,
    title        = {{The Choice of Divergence: A Neglected Key to Mitigating Diversity Collapse in Reinforcement Learning with Verifiable Reward}},
    author       = {Long Li and Zhijian Zhou and Jiaran Hao and Jason Klein Liu and Yanting Miao and Wei Pang and Xiaoyu Tan and Wei Chu and Zhe Wang and Shirui Pan and Chao Qu and Yuan Qi},
    year         = 2025,
    eprint       = {arXiv:2509.07430},
}"""

APO = """@article{brantley2025accelerating,
    title        = {{Accelerating RL for LLM Reasoning with Optimal Advantage Regression}},
    author       = {Kiant{\\'e} Brantley and Mingyu Chen and Zhaolin Gao and Jason D. Lee and Wen Sun and Wenhao Zhan and Xuezhou Zhang},
    year         = 2025,
    eprint       = {arXiv:2505.20686},
}"""
