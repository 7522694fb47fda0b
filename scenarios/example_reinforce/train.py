"""Healthy workload written like PyTorch's examples/reinforcement_learning/reinforce.py, on a local
CartPole (cartpole.py). The policy has dropout and runs in training mode while acting, with gradients on
(its log-probabilities are the loss): one optimizer step per episode.
"""
import numpy as np
import torch
import torch.nn.functional as F
from cartpole import CartPole
from torch import nn, optim
from torch.distributions import Categorical

import trainguard


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)
        self.saved_log_probs, self.rewards = [], []

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


def main():
    torch.manual_seed(543); torch.set_num_threads(1)
    env = CartPole(seed=543)
    policy = Policy()
    optimizer = optim.Adam(policy.parameters(), lr=1e-2)
    eps = np.finfo(np.float32).eps.item()
    gamma, episodes = 0.99, 60
    guard = trainguard.watch(policy, optimizer, total_steps=episodes)

    def select_action(state):
        state = torch.from_numpy(np.array(state, dtype=np.float32)).unsqueeze(0)
        m = Categorical(policy(state))
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        R, returns = 0.0, []
        for r in policy.rewards[::-1]:
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        loss = torch.cat([-lp * R for lp, R in zip(policy.saved_log_probs, returns)]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        del policy.rewards[:], policy.saved_log_probs[:]
        return loss

    running_reward = 10.0
    for episode in range(1, episodes + 1):
        state, ep_reward = env.reset(), 0.0
        for t in range(1, 200):
            state, reward, done = env.step(select_action(state))
            policy.rewards.append(reward)
            ep_reward += reward
            if done:
                break
        running_reward = 0.05 * ep_reward + 0.95 * running_reward
        loss = finish_episode()
        guard.log(episode_reward=ep_reward)
        if episode % 10 == 0:
            print(f"episode {episode}: last reward {ep_reward:.0f}, running {running_reward:.1f}, loss {loss.item():.3f}")
    guard.finish()


if __name__ == "__main__":
    main()
