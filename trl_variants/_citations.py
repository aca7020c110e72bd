"""BibTeX entries for the model cards (each trainer cites its paper and GRPO, which it extends)."""

GRPO = """@article{shao2024deepseekmath,
    title        = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author       = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Xiao Bi and Haowei Zhang and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
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

DAPO = """@article{yu2025dapo,
    title        = {{DAPO: An Open-Source LLM Reinforcement Learning System at Scale}},
    author       = {Qiying Yu and Zheng Zhang and Ruofei Zhu and Yufeng Yuan and Xiaochen Zuo and Yu Yue and Weinan Dai and Tiantian Fan and Gaohong Liu and Lingjun Liu and Xin Liu and Haibin Lin and Zhiqi Lin and Bole Ma and Guangming Sheng and Yuxuan Tong and Chi Zhang and Mofan Zhang and Wang Zhang and Hang Zhu and Jinhua Zhu and Jiaze Chen and Jiangjie Chen and Chengyi Wang and Hongli Yu and Yuxuan Song and Xiangpeng Wei and Hao Zhou and Jingjing Liu and Wei-Ying Ma and Ya-Qin Zhang and Lin Yan and Mu Qiao and Yonghui Wu and Mingxuan Wang},
    year         = 2025,
    eprint       = {arXiv:2503.14476},
}"""
