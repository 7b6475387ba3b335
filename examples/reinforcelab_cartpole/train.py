"""Train the example agent in process on Gymnasium's CartPole-v1 and save ``weights.json``.

    python examples/reinforcelab_cartpole/train.py

Random search until one set of weights reaches 500 in 20 episodes in a row. Deterministic: the
agent's search and the env's first reset are seeded.
"""

import gymnasium as gym
from agent import Agent


def main(seed: int = 7) -> None:
    env = gym.make("CartPole-v1")
    env.reset(seed=seed)  # later resets continue this seed's stream
    agent = Agent(env, seed=seed)
    tried = 0
    while True:
        candidate = agent.rng.uniform(-1.0, 1.0, size=4)
        tried += 1
        if all(agent.play(candidate) >= 500.0 for _ in range(20)):
            agent.weights = candidate
            agent.save()
            print(f"saved weights {[round(float(w), 4) for w in candidate]} after {tried} candidates")
            return


if __name__ == "__main__":
    main()
