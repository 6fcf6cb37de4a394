"""Towers fed by placeholders (tf.split), gradients averaged as the classic tutorial averages them
(the mean over a concat of expand_dims), trained in a plain tf.Session.

    python -m legacy.run_tf1 plain_session.py --num_gpus 2 --max_steps 3
"""
import argparse

import tensorflow as tf

import tiny_towers


def average_gradients(tower_grads):
  average_grads = []
  for grad_and_vars in zip(*tower_grads):
    grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
    grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
    average_grads.append((grad, grad_and_vars[0][1]))
  return average_grads


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--num_gpus', type=int, default=2)
  parser.add_argument('--batch_size', type=int, default=4, help='rows per tower')
  parser.add_argument('--max_steps', type=int, default=3)
  args = parser.parse_args()
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    x = tf.placeholder(tf.float32, [None, tiny_towers.FEATURES], name='x')
    y = tf.placeholder(tf.int32, [None], name='y')
    opt = tf.train.GradientDescentOptimizer(0.1)
    tower_grads = []
    with tf.variable_scope(tf.get_variable_scope()):
      for i, (xs, ys) in enumerate(zip(tf.split(x, args.num_gpus), tf.split(y, args.num_gpus))):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
          loss = tiny_towers.tower_loss(xs, ys)
          tf.get_variable_scope().reuse_variables()
          tower_grads.append(opt.compute_gradients(loss))
    train_op = opt.apply_gradients(average_gradients(tower_grads), global_step=global_step)
    images, labels = tiny_towers.data(args.batch_size * args.num_gpus)
    with tf.Session(config=tf.ConfigProto(allow_soft_placement=True)) as sess:
      sess.run(tf.global_variables_initializer())
      for step in range(args.max_steps):
        _, loss_value = sess.run([train_op, loss], {x: images, y: labels})
        print('step %d, loss %.4f' % (step, loss_value))


if __name__ == '__main__':
  main()
