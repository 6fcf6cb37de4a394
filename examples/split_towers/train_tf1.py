"""Train a small convnet with synchronous towers on one machine (TensorFlow 1, 2017 style).

    python -m legacy.run_tf1 examples/split_towers/train_tf1.py --data_dir DIR --num_gpus 2

Written for TensorFlow 1.x and run as it is on TensorFlow 2.21 by `legacy/run_tf1/`: `import
tensorflow as tf`, `tf.app.flags`, queue runners, `tf.contrib.layers`, towers on `/gpu:%d`.  One
global batch is dequeued and cut into one slice per tower with `tf.split`; each tower computes its
loss (softmax cross-entropy with label smoothing, plus the weight decay of every weight) and its
gradients; the gradients are averaged on the CPU, clipped by their global norm, and applied by
RMSProp (decay 0.9, momentum 0.9, epsilon 1.0) on an exponentially decaying rate.  The graph,
the session and the loop are built in one function, `train()`.  Its Keras 3 port is
modern_train.py; adapter.py lets the parity harness judge the two.
"""
import os
import time

import numpy as np
import tensorflow as tf

import towers_input

FLAGS = tf.app.flags.FLAGS

tf.app.flags.DEFINE_string('data_dir', '/tmp/split_towers_data', 'folder of train-*.tfrecord files')
tf.app.flags.DEFINE_string('train_dir', '/tmp/split_towers_train', 'where checkpoints are written')
tf.app.flags.DEFINE_integer('num_gpus', 1, 'towers, one per GPU')
tf.app.flags.DEFINE_integer('batch_size', 64, 'images per step, split across the towers')
tf.app.flags.DEFINE_integer('max_steps', 1000, 'training steps')
tf.app.flags.DEFINE_integer('num_examples_per_epoch', 10000, 'training images per epoch')
tf.app.flags.DEFINE_float('initial_learning_rate', 0.01, 'learning rate at step 0')
tf.app.flags.DEFINE_float('num_epochs_per_decay', 2.0, 'epochs per decay of the rate by the factor below')
tf.app.flags.DEFINE_float('learning_rate_decay_factor', 0.94, 'learning rate decay factor')
tf.app.flags.DEFINE_float('rmsprop_decay', 0.9, 'RMSProp decay of the mean square')
tf.app.flags.DEFINE_float('rmsprop_momentum', 0.9, 'RMSProp momentum')
tf.app.flags.DEFINE_float('rmsprop_epsilon', 1.0, 'RMSProp epsilon')
tf.app.flags.DEFINE_float('clip_norm', 2.0, 'global norm the averaged gradients are clipped to')
tf.app.flags.DEFINE_float('label_smoothing', 0.1, 'label smoothing of the cross-entropy')
tf.app.flags.DEFINE_float('weight_decay', 0.00004, 'l2 weight decay of every weight')
tf.app.flags.DEFINE_integer('num_preprocess_threads', 4, 'input threads')
tf.app.flags.DEFINE_integer('min_after_dequeue', 1000, 'rows the shuffle queue keeps')


def conv(inputs, name, kernel, depth, regularizer):
    with tf.variable_scope(name):
        channels = inputs.get_shape()[-1].value
        weights = tf.get_variable('weights', [kernel, kernel, channels, depth], regularizer=regularizer,
                                  initializer=tf.truncated_normal_initializer(stddev=0.05))
        biases = tf.get_variable('biases', [depth], initializer=tf.constant_initializer(0.0))
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(inputs, weights, [1, 1, 1, 1], padding='SAME'), biases))


def dense(inputs, name, units, regularizer, relu=True):
    with tf.variable_scope(name):
        weights = tf.get_variable('weights', [inputs.get_shape()[1].value, units], regularizer=regularizer,
                                  initializer=tf.truncated_normal_initializer(stddev=0.05))
        biases = tf.get_variable('biases', [units], initializer=tf.constant_initializer(0.0))
        outputs = tf.matmul(inputs, weights) + biases
        return tf.nn.relu(outputs) if relu else outputs


def inference(images):
    """32x32x3 -> conv 5x5x32 -> pool -> conv 5x5x64 -> pool -> fc 128 -> 10 logits."""
    regularizer = tf.contrib.layers.l2_regularizer(FLAGS.weight_decay)
    net = conv(images, 'conv1', 5, 32, regularizer)
    net = tf.nn.max_pool(net, [1, 3, 3, 1], [1, 2, 2, 1], padding='SAME')
    net = conv(net, 'conv2', 5, 64, regularizer)
    net = tf.nn.max_pool(net, [1, 3, 3, 1], [1, 2, 2, 1], padding='SAME')
    net = tf.reshape(net, [-1, 8 * 8 * 64])
    net = dense(net, 'fc3', 128, regularizer)
    return dense(net, 'logits', towers_input.NUM_CLASSES, regularizer, relu=False)


def tower_loss(images, labels):
    """The cross-entropy of one tower's slice, with label smoothing, plus the weight decay."""
    logits = inference(images)
    onehot = tf.one_hot(labels, towers_input.NUM_CLASSES)
    cross_entropy = tf.losses.softmax_cross_entropy(onehot, logits, label_smoothing=FLAGS.label_smoothing)
    regularization = tf.add_n(tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
    return cross_entropy + regularization


def average_gradients(tower_grads):
    average_grads = []
    for grad_and_vars in zip(*tower_grads):
        grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
        grad = tf.reduce_mean(tf.concat(grads, 0), 0)
        average_grads.append((grad, grad_and_vars[0][1]))
    return average_grads


def train():
    with tf.Graph().as_default(), tf.device('/cpu:0'):
        global_step = tf.train.get_or_create_global_step()
        decay_steps = int(FLAGS.num_examples_per_epoch / FLAGS.batch_size * FLAGS.num_epochs_per_decay)
        lr = tf.train.exponential_decay(FLAGS.initial_learning_rate, global_step, decay_steps,
                                        FLAGS.learning_rate_decay_factor)
        opt = tf.train.RMSPropOptimizer(lr, FLAGS.rmsprop_decay, momentum=FLAGS.rmsprop_momentum,
                                        epsilon=FLAGS.rmsprop_epsilon)
        images, labels = towers_input.inputs(FLAGS.data_dir, FLAGS.batch_size, FLAGS.num_preprocess_threads,
                                             FLAGS.min_after_dequeue)
        images_splits = tf.split(images, FLAGS.num_gpus, 0)
        labels_splits = tf.split(labels, FLAGS.num_gpus, 0)
        tower_grads = []
        with tf.variable_scope(tf.get_variable_scope()):
            for i in range(FLAGS.num_gpus):
                with tf.device('/gpu:%d' % i):
                    with tf.name_scope('tower_%d' % i):
                        loss = tower_loss(images_splits[i], labels_splits[i])
                        tf.get_variable_scope().reuse_variables()
                        tower_grads.append(opt.compute_gradients(loss))
        grads, variables = zip(*average_gradients(tower_grads))
        grads, global_norm = tf.clip_by_global_norm(grads, FLAGS.clip_norm)
        train_op = opt.apply_gradients(zip(grads, variables), global_step=global_step)
        saver = tf.train.Saver(tf.global_variables())
        init = tf.global_variables_initializer()
        sess = tf.Session(config=tf.ConfigProto(allow_soft_placement=True))
        sess.run(init)
        tf.train.start_queue_runners(sess=sess)
        for step in range(FLAGS.max_steps):
            start_time = time.time()
            _, loss_value, norm = sess.run([train_op, loss, global_norm])
            assert not np.isnan(loss_value), 'Model diverged with loss = NaN'
            if step % 10 == 0:
                print('step %d, loss = %.3f, gradient norm %.2f (%.3f sec/step)'
                      % (step, loss_value, norm, time.time() - start_time))
        if not tf.gfile.Exists(FLAGS.train_dir):
            tf.gfile.MakeDirs(FLAGS.train_dir)
        saver.save(sess, os.path.join(FLAGS.train_dir, 'model.ckpt'), global_step=FLAGS.max_steps)


def main(argv=None):
    train()


if __name__ == '__main__':
    tf.app.run()
