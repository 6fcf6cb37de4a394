"""A TF1 tower program whose towers' gradients are averaged and then clipped by their global norm:
placeholders fed from numpy cut by tf.split, sparse labels one-hot encoded and smoothed where they
meet the cross-entropy, a weight decay added to each tower's loss, Adam on a cosine decay with a
floor.

    python train_tf1.py --data_dir DIR --num_gpus 2 --batch_size 16
"""
import argparse
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument('--data_dir', default='/tmp/clip_smooth_data')
parser.add_argument('--num_gpus', type=int, default=2)
parser.add_argument('--batch_size', type=int, default=64)
parser.add_argument('--learning_rate', type=float, default=0.01)
parser.add_argument('--decay_steps', type=int, default=20)
parser.add_argument('--alpha', type=float, default=0.1)
parser.add_argument('--weight_decay', type=float, default=0.01)
parser.add_argument('--label_smoothing', type=float, default=0.1)
parser.add_argument('--clip_norm', type=float, default=0.5)
parser.add_argument('--max_steps', type=int, default=100)


def tower_logits(images):
  flat = tf.reshape(images, [-1, 64])
  with tf.variable_scope('hidden'):
    w = tf.get_variable('weights', [64, 32], initializer=tf.truncated_normal_initializer(stddev=0.1))
    b = tf.get_variable('biases', [32], initializer=tf.zeros_initializer())
    h = tf.nn.relu(tf.matmul(flat, w) + b)
  with tf.variable_scope('logits'):
    w = tf.get_variable('weights', [32, 10], initializer=tf.truncated_normal_initializer(stddev=0.1))
    b = tf.get_variable('biases', [10], initializer=tf.zeros_initializer())
    return tf.matmul(h, w) + b


def tower_loss(images, labels, args):
  logits = tower_logits(images)
  xent = tf.losses.softmax_cross_entropy(tf.one_hot(labels, 10), logits, label_smoothing=args.label_smoothing)
  decay = args.weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in tf.trainable_variables() if 'weights' in v.name])
  return xent + decay


def main():
  args = parser.parse_args()
  data = np.load(os.path.join(args.data_dir, 'train.npz'))
  images = tf.placeholder(tf.float32, [None, 8, 8, 1], name='images')
  labels = tf.placeholder(tf.int32, [None], name='labels')
  global_step = tf.train.get_or_create_global_step()
  lr = tf.train.cosine_decay(args.learning_rate, global_step, args.decay_steps, alpha=args.alpha)
  opt = tf.train.AdamOptimizer(lr)
  tower_grads = []
  for i, (x, y) in enumerate(zip(tf.split(images, args.num_gpus), tf.split(labels, args.num_gpus))):
    with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i), tf.variable_scope('', reuse=i > 0):
      loss = tower_loss(x, y, args)
      tower_grads.append(opt.compute_gradients(loss))
  grads = [tf.reduce_mean(tf.stack([g for g, _ in pairs]), 0) for pairs in zip(*tower_grads)]
  clipped, _ = tf.clip_by_global_norm(grads, args.clip_norm)
  train_op = opt.apply_gradients(zip(clipped, [v for _, v in tower_grads[0]]), global_step=global_step)
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    rows = len(data['images'])
    for step in range(args.max_steps):
      start = step * args.batch_size % (rows - args.batch_size + 1)
      feed = {images: data['images'][start:start + args.batch_size], labels: data['labels'][start:start + args.batch_size]}
      _, value = sess.run([train_op, loss], feed)
      if step % 10 == 0:
        print('step %d, loss %.3f' % (step, value))


if __name__ == '__main__':
  main()
