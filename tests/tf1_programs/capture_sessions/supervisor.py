"""Towers fed by placeholders (tf.split), gradients averaged (the classic mean over a concat) and then
clipped by their global norm, trained under a tf.train.Supervisor (which finalizes the graph).

    python -m legacy.run_tf1 supervisor.py --num_gpus 2 --train_dir /tmp/supervisor
"""
import argparse

import tensorflow as tf

import tiny_towers


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--num_gpus', type=int, default=2)
  parser.add_argument('--batch_size', type=int, default=4, help='rows per tower')
  parser.add_argument('--max_steps', type=int, default=3)
  parser.add_argument('--clip_norm', type=float, default=1.0)
  parser.add_argument('--train_dir', default='/tmp/supervisor')
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
    grads, variables = [], []
    for gv in zip(*tower_grads):
      grads.append(tf.reduce_mean(tf.concat([tf.expand_dims(g, 0) for g, _ in gv], 0), 0))
      variables.append(gv[0][1])
    grads, _ = tf.clip_by_global_norm(grads, args.clip_norm)
    train_op = opt.apply_gradients(zip(grads, variables), global_step=global_step)
    images, labels = tiny_towers.data(args.batch_size * args.num_gpus)
    sv = tf.train.Supervisor(logdir=args.train_dir, global_step=global_step, save_model_secs=0,
                             save_summaries_secs=0)
    with sv.managed_session(config=tf.ConfigProto(allow_soft_placement=True)) as sess:
      for step in range(args.max_steps):
        if sv.should_stop():
          break
        _, loss_value = sess.run([train_op, loss], {x: images, y: labels})
        print('step %d, loss %.4f' % (step, loss_value))


if __name__ == '__main__':
  main()
