"""Healthy workload written like PyTorch's examples/reinforcement_learning/actor_critic.py, on a local
CartPole (cartpole.py): a shared body with an action head and a value head, smooth L1 for the critic,
one optimizer step per episode.
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
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)
        self.saved_actions, self.rewards = [], []

    def forward(self, x):
        x = F.relu(self.affine1(x))
        return F.softmax(self.action_head(x), dim=-1), self.value_head(x)


def main():
    torch.manual_seed(543); torch.set_num_threads(1)
    env = CartPole(seed=543)
    model = Policy()
    optimizer = optim.Adam(model.parameters(), lr=3e-2)
    eps = np.finfo(np.float32).eps.item()
    gamma, episodes = 0.99, 60
    guard = trainguard.watch(model, optimizer, total_steps=episodes)

    def select_action(state):
        state = torch.from_numpy(np.array(state, dtype=np.float32)).float()
        probs, state_value = model(state)
        m = Categorical(probs)
        action = m.sample()
        model.saved_actions.append((m.log_prob(action), state_value))
        return action.item()

    def finish_episode():
        R, returns = 0.0, []
        for r in model.rewards[::-1]:
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        policy_losses, value_losses = [], []
        for (log_prob, value), R in zip(model.saved_actions, returns):
            advantage = R - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
        optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        loss.backward()
        optimizer.step()
        del model.rewards[:], model.saved_actions[:]
        return loss

    running_reward = 10.0
    for episode in range(1, episodes + 1):
        state, ep_reward = env.reset(), 0.0
        for t in range(1, 200):
            state, reward, done = env.step(select_action(state))
            model.rewards.append(reward)
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
